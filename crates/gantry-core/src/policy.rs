//! The lab policy: `/etc/gantry/config.toml` for the system engine, `daemon --config FILE` (or
//! `GANTRY_CONFIG`) for any other. Every key is optional; the defaults are the constants in
//! [`crate::config`]. The file is checked before the engine starts, and again on every reload
//! (SIGHUP): each problem names the file, line and column, and how to fix it. A reload that fails
//! keeps the policy in force.

use std::collections::BTreeSet;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::defaults as config;

/// A duration as a lab config writes it: `30d`, `12h`, `90m`, `10s` (humantime would say `1month 9days ...`).
pub use crate::units::duration_setting as human;

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
    pub fair_share_half_life: Duration,
    pub stop_grace: Duration,
    pub retry_backoff: Duration,
    pub reserve_after: Duration,
    pub log_cap: u64,
    /// Log files of jobs that ended longer ago are deleted (`None`: kept).
    pub log_keep: Option<Duration>,
    /// Finished jobs that ended longer ago are deleted from history (`None`: kept).
    pub history_keep: Option<Duration>,
    /// `[containers]`: shm, ulimits, IPC, HOME, and each job's CPU and RAM.
    pub containers: crate::resources::Containers,
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
            fair_share_half_life: config::FAIR_SHARE_HALF_LIFE,
            stop_grace: config::STOP_GRACE,
            retry_backoff: config::RETRY_BACKOFF,
            reserve_after: config::RESERVE_AFTER,
            log_cap: config::LOG_CAP,
            log_keep: None,
            history_keep: None,
            containers: Default::default(),
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
            || self.admin_gid.is_some_and(|g| nix::unistd::User::from_uid(uid.into()).ok().flatten().is_some_and(|u| u.gid.as_raw() == g))
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
            ("limits.max_running_gpus", self.max_running_gpus.map(|n| n.to_string()).unwrap_or_else(|| "none".into())),
            ("limits.default_timeout", d(self.default_timeout)),
            ("limits.max_timeout", d(self.max_timeout)),
            ("fair_share.half_life", d(Some(self.fair_share_half_life))),
            ("jobs.stop_grace", d(Some(self.stop_grace))),
            ("jobs.retry_backoff", d(Some(self.retry_backoff))),
            ("jobs.reserve_after", d(Some(self.reserve_after))),
            ("logs.cap", crate::units::format_bytes(self.log_cap)),
            ("logs.keep", d(self.log_keep)),
            ("history.keep", d(self.history_keep)),
            ("admin uids", format!("{:?} (group gid {:?})", self.admin_uids, self.admin_gid)),
        ];
        v.extend(self.containers.entries());
        v
    }

    /// What differs from `old`, as `key: old -> new` lines.
    pub fn changes_from(&self, old: &Policy) -> Vec<String> {
        old.entries().into_iter().zip(self.entries()).filter(|(a, b)| a.1 != b.1).map(|(a, b)| format!("{}: {} -> {}", a.0, a.1, b.1)).collect()
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
            inventory.iter().map(|(i, u)| format!("{i} ({u})")).collect::<Vec<_>>().join(", ")
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
                        format!("use indexes or UUIDs of this machine's GPUs: {}; or write gpus = \"all\"", have()),
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
}

impl LabConfig {
    /// Read and check `file`. A missing file means the defaults when `missing_ok` (the system
    /// engine's `/etc/gantry/config.toml`), and is an error otherwise (`--config FILE`).
    pub fn load(file: &Path, missing_ok: bool) -> Result<LabConfig, PolicyError> {
        use std::io::Read;
        let opened = std::fs::File::open(file);
        let text = match opened {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && missing_ok => return Ok(LabConfig::default()),
            Err(e) => return Err(PolicyError::file(file, format!("cannot read it: {e}"), "check the path and that the engine's user may read it")),
            Ok(f) => {
                let mut s = String::new();
                f.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut s).map_err(|e| PolicyError::file(file, format!("cannot read it: {e}"), "save it as UTF-8 text"))?;
                if s.len() as u64 > MAX_CONFIG_BYTES {
                    return Err(PolicyError::file(file, "it is larger than 1 MiB".into(), "a lab config is a page of settings; check that this is the right file"));
                }
                s
            }
        };
        Self::parse(&text, file)
    }

    /// Check the text of a lab config (`file` names it in errors).
    pub fn parse(text: &str, file: &Path) -> Result<LabConfig, PolicyError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let (line, column) = e.span().map(|s| crate::units::line_col(text, s.start)).unwrap_or((0, 0));
            let msg = e.message().trim().to_string();
            let hint = if msg.contains("unknown field") {
                "remove or rename the key; the packaged /etc/gantry/config.toml documents every key"
            } else {
                "fix the value's type or syntax; the packaged /etc/gantry/config.toml shows each key with an example"
            };
            PolicyError::at(file, line, column, msg, hint.into())
        })?;
        let mut c = Check { text, file, problems: vec![] };
        let lab = c.build(raw);
        if c.problems.is_empty() {
            Ok(LabConfig { file: Some(file.to_path_buf()), ..lab })
        } else {
            Err(PolicyError { problems: c.problems })
        }
    }

    /// The names of settings that differ from `old` and only apply after a restart.
    pub fn restart_only_changes(&self, old: &LabConfig) -> Vec<&'static str> {
        let mut out = vec![];
        if self.gpus.as_ref().map(|g| &g.gpus) != old.gpus.as_ref().map(|g| &g.gpus) {
            out.push("gpus");
        }
        if self.simulate != old.simulate {
            out.push("simulate");
        }
        if self.inbox_group != old.inbox_group {
            out.push("inbox.group");
        }
        if self.inbox_path != old.inbox_path {
            out.push("inbox.path");
        }
        if self.templates_dir != old.templates_dir {
            out.push("inbox.templates");
        }
        if self.backend != old.backend {
            out.push("backend");
        }
        if self.slurm != old.slurm {
            out.push("slurm");
        }
        out
    }
}

/// One problem in a lab config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    pub file: PathBuf,
    /// 1-based; 0 when the problem is with the file as a whole.
    pub line: usize,
    pub column: usize,
    pub message: String,
    /// How to fix it.
    pub hint: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}; {}", self.file.display(), self.message, self.hint)
        } else {
            write!(f, "{}:{}:{}: {}; {}", self.file.display(), self.line, self.column, self.message, self.hint)
        }
    }
}

/// Every problem found in a lab config (one line each).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct PolicyError {
    pub problems: Vec<Problem>,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.problems.iter().map(|p| p.to_string()).collect();
        f.write_str(&lines.join("\n"))
    }
}

impl PolicyError {
    fn at(file: &Path, line: usize, column: usize, message: String, hint: String) -> PolicyError {
        PolicyError { problems: vec![Problem { file: file.to_path_buf(), line, column, message, hint }] }
    }
    fn file(file: &Path, message: String, hint: &str) -> PolicyError {
        Self::at(file, 0, 0, message, hint.into())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    gpus: Option<Spanned<toml::Value>>,
    simulate: Option<Spanned<String>>,
    #[serde(default)]
    access: RawAccess,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    fair_share: RawFairShare,
    #[serde(default)]
    jobs: RawJobs,
    #[serde(default)]
    logs: RawLogs,
    #[serde(default)]
    history: RawHistory,
    #[serde(default)]
    inbox: RawInbox,
    #[serde(default)]
    containers: RawContainers,
    backend: S<String>,
    #[serde(default)]
    slurm: RawSlurm,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawSlurm {
    partition: S<String>,
    account: S<String>,
    qos: S<String>,
    poll: S<String>,
    log_dir: S<String>,
    runtime: S<String>,
    shard_memory: S<String>,
    max_nice: S<i64>,
    jobcomp_log: S<String>,
    node_samples: S<String>,
}

/// Sizes and CPU counts are strings or numbers (`cpus_per_gpu = 8`, `= "auto"`).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawContainers {
    shm_size: S<String>,
    memlock: S<String>,
    stack: S<String>,
    allow_ipc_host: S<bool>,
    home: S<String>,
    cpus_per_gpu: S<toml::Value>,
    memory_per_gpu: S<String>,
    cpu_only_cpus: S<toml::Value>,
    cpu_only_memory: S<String>,
    reserve_cpus: S<toml::Value>,
    reserve_memory: S<String>,
}

type S<T> = Option<Spanned<T>>;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawAccess {
    admins: S<Vec<Spanned<String>>>,
    admin_group: S<String>,
    see_others: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    priority: S<Vec<i64>>,
    admin_priority: S<Vec<i64>>,
    max_queued_jobs: S<i64>,
    max_running_gpus: S<i64>,
    default_timeout: S<String>,
    max_timeout: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawFairShare {
    half_life: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawJobs {
    stop_grace: S<String>,
    retry_backoff: S<String>,
    reserve_after: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLogs {
    cap: S<String>,
    keep: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawHistory {
    keep: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawInbox {
    group: S<String>,
    path: S<String>,
    templates: S<String>,
}

/// Collects every problem (not just the first), each at its value's line and column.
struct Check<'a> {
    text: &'a str,
    file: &'a Path,
    problems: Vec<Problem>,
}

impl Check<'_> {
    fn fail(&mut self, span: Range<usize>, message: String, hint: impl Into<String>) {
        let (line, column) = crate::units::line_col(self.text, span.start);
        self.problems.push(Problem { file: self.file.to_path_buf(), line, column, message, hint: hint.into() });
    }

    fn duration(&mut self, key: &str, v: &S<String>, max: Duration) -> Option<Duration> {
        let v = v.as_ref()?;
        match humantime::parse_duration(v.get_ref().trim()) {
            Ok(d) if d > Duration::ZERO && d <= max => Some(d),
            Ok(d) if d > max => {
                self.fail(v.span(), format!("`{key}` = {:?} is longer than {}", v.get_ref(), human(max)), format!("use at most \"{}\"", human(max)));
                None
            }
            _ => {
                self.fail(v.span(), format!("`{key}` = {:?} is not a duration", v.get_ref()), "write e.g. \"10s\", \"30m\", \"24h\" or \"7d\"");
                None
            }
        }
    }

    fn range(&mut self, key: &str, v: &S<Vec<i64>>) -> Option<(i32, i32)> {
        let v = v.as_ref()?;
        let hint = "write [lowest, highest], e.g. [-10, 10]";
        match v.get_ref().as_slice() {
            [lo, hi] if i32::try_from(*lo).is_err() || i32::try_from(*hi).is_err() => {
                self.fail(v.span(), format!("`{key}` = [{lo}, {hi}] is outside what a priority can hold"), format!("use values from {} to {}", i32::MIN, i32::MAX));
                None
            }
            [lo, hi] if lo > hi => {
                self.fail(v.span(), format!("`{key}` = [{lo}, {hi}]: the lowest value is above the highest"), format!("swap them: [{hi}, {lo}]"));
                None
            }
            [lo, hi] => Some((*lo as i32, *hi as i32)),
            other => {
                self.fail(v.span(), format!("`{key}` has {} values, not 2", other.len()), hint);
                None
            }
        }
    }

    fn count(&mut self, key: &str, v: &S<i64>, max: i64) -> Option<i64> {
        let v = v.as_ref()?;
        let n = *v.get_ref();
        if n < 1 || n > max {
            self.fail(v.span(), format!("`{key}` = {n} is out of range"), format!("use a number from 1 to {max}, or leave `{key}` out"));
            return None;
        }
        Some(n)
    }

    fn build(&mut self, raw: RawFile) -> LabConfig {
        let mut p = Policy::default();
        // [access]
        if let Some(admins) = &raw.access.admins {
            p.admins = vec![];
            for name in admins.get_ref() {
                match nix::unistd::User::from_name(name.get_ref()) {
                    Ok(Some(u)) => {
                        p.admin_uids.insert(u.uid.as_raw());
                    }
                    _ => self.fail(name.span(), format!("`admins` names {:?}, which is not a user on this machine", name.get_ref()), "check the spelling (`getent passwd NAME`), or remove the name"),
                }
                p.admins.push(name.get_ref().clone());
            }
        }
        if let Some(g) = &raw.access.admin_group {
            match nix::unistd::Group::from_name(g.get_ref()) {
                Ok(Some(grp)) => {
                    p.admin_gid = Some(grp.gid.as_raw());
                    for m in &grp.mem {
                        if let Ok(Some(u)) = nix::unistd::User::from_name(m) {
                            p.admin_uids.insert(u.uid.as_raw());
                        }
                    }
                    p.admin_group = Some(g.get_ref().clone());
                }
                _ => self.fail(g.span(), format!("`admin_group` = {:?} is not a group on this machine", g.get_ref()), "create it (`groupadd NAME`, then `usermod -aG NAME USER`), or remove `admin_group`"),
            }
        }
        if let Some(s) = &raw.access.see_others {
            match s.get_ref().as_str() {
                "queue" => p.see_others = SeeOthers::Queue,
                "all" => p.see_others = SeeOthers::All,
                other => self.fail(s.span(), format!("`see_others` = {other:?} is not a choice"), "write \"queue\" (other users' queue rows only) or \"all\" (their specs and logs too)"),
            }
        }
        // [limits]
        if let Some(r) = self.range("priority", &raw.limits.priority) {
            p.user_priority = r;
        }
        if let Some(r) = self.range("admin_priority", &raw.limits.admin_priority) {
            p.admin_priority = r;
        }
        if let Some(n) = self.count("max_queued_jobs", &raw.limits.max_queued_jobs, 1_000_000) {
            p.max_queued_per_user = n as usize;
        }
        p.max_running_gpus = self.count("max_running_gpus", &raw.limits.max_running_gpus, 1024).map(|n| n as u32);
        p.default_timeout = self.duration("default_timeout", &raw.limits.default_timeout, crate::spec::MAX_DURATION);
        p.max_timeout = self.duration("max_timeout", &raw.limits.max_timeout, crate::spec::MAX_DURATION);
        if let (Some(d), Some(m), Some(at)) = (p.default_timeout, p.max_timeout, &raw.limits.default_timeout) {
            if d > m {
                self.fail(
                    at.span(),
                    format!("`default_timeout` ({}) is longer than `max_timeout` ({})", human(d), human(m)),
                    "lower `default_timeout` or raise `max_timeout`",
                );
            }
        }
        // [fair_share], [jobs]
        let day = Duration::from_secs(24 * 3600);
        if let Some(d) = self.duration("half_life", &raw.fair_share.half_life, 365 * day) {
            p.fair_share_half_life = d;
        }
        if let Some(d) = self.duration("stop_grace", &raw.jobs.stop_grace, day) {
            p.stop_grace = d;
        }
        if let Some(d) = self.duration("retry_backoff", &raw.jobs.retry_backoff, config::RETRY_BACKOFF_MAX) {
            p.retry_backoff = d;
        }
        if let Some(d) = self.duration("reserve_after", &raw.jobs.reserve_after, 365 * day) {
            p.reserve_after = d;
        }
        // [logs], [history]
        if let Some(c) = &raw.logs.cap {
            match crate::units::parse_bytes(c.get_ref()) {
                Some(b) if b >= 4096 => p.log_cap = b,
                _ => self.fail(c.span(), format!("`cap` = {:?} is not a size of at least 4 KiB", c.get_ref()), "write e.g. \"64MiB\" or \"1GiB\""),
            }
        }
        p.log_keep = self.duration("keep", &raw.logs.keep, 100 * 365 * day);
        p.history_keep = self.duration("keep", &raw.history.keep, 100 * 365 * day);
        p.containers = self.containers(&raw.containers);
        // Restart-only settings.
        let gpus = raw.gpus.as_ref().and_then(|g| self.gpus(g));
        if let Some(s) = &raw.simulate {
            if let Err(e) = crate::gpu::SimulatedBackend::from_spec(s.get_ref()) {
                self.fail(s.span(), e.to_string(), "or remove `simulate` to use the machine's GPUs");
            }
        }
        let inbox_path = raw.inbox.path.as_ref().and_then(|v| {
            let p = PathBuf::from(v.get_ref());
            if p.is_absolute() || p.components().any(|c| !matches!(c, std::path::Component::Normal(_))) || v.get_ref().is_empty() {
                self.fail(v.span(), format!("inbox `path` = {:?} is not a plain path inside a user's home", v.get_ref()), "write a relative path without `..`, e.g. \"Gantry/inbox\"");
                return None;
            }
            Some(p)
        });
        let templates_dir = raw.inbox.templates.as_ref().and_then(|v| {
            let p = PathBuf::from(v.get_ref());
            if !p.is_absolute() {
                self.fail(v.span(), format!("inbox `templates` = {:?} is not an absolute path", v.get_ref()), "write e.g. \"/etc/gantry/templates\"");
                return None;
            }
            Some(p)
        });
        let backend = match raw.backend.as_ref().map(|b| (b.get_ref().as_str(), b.span())) {
            None | Some(("docker", _)) => crate::slurm::BackendChoice::Docker,
            Some(("slurm", _)) => crate::slurm::BackendChoice::Slurm,
            Some((other, span)) => {
                self.fail(span, format!("`backend` = {other:?} is not a choice"), "write \"docker\" (Gantry schedules this machine's GPUs) or \"slurm\" (Slurm schedules; Gantry submits)");
                crate::slurm::BackendChoice::Docker
            }
        };
        let slurm = self.slurm(&raw.slurm);
        LabConfig {
            file: None,
            policy: p,
            gpus,
            simulate: raw.simulate.map(|s| s.into_inner()),
            inbox_group: raw.inbox.group.map(|s| s.into_inner()),
            inbox_path,
            templates_dir,
            backend,
            slurm,
        }
    }

    fn slurm(&mut self, raw: &RawSlurm) -> crate::slurm::Settings {
        use crate::slurm::{Runtime, Settings};
        let mut s = Settings::default();
        let name = |v: &S<String>| v.as_ref().map(|v| v.get_ref().trim().to_string()).filter(|v| !v.is_empty());
        s.partition = name(&raw.partition);
        s.account = name(&raw.account);
        s.qos = name(&raw.qos);
        for (key, v) in [("partition", &raw.partition), ("account", &raw.account), ("qos", &raw.qos)] {
            if let Some(v) = v.as_ref().filter(|v| v.get_ref().chars().any(|c| c.is_whitespace() || c.is_control() || c == ',')) {
                self.fail(v.span(), format!("slurm `{key}` = {:?} is not a Slurm name", v.get_ref()), "write the name as `sinfo`/`sacctmgr` show it, without spaces");
            }
        }
        if let Some(d) = self.duration("poll", &raw.poll, Duration::from_secs(300)) {
            s.poll = d;
        }
        for (key, v, out) in [("log_dir", &raw.log_dir, &mut s.log_dir), ("jobcomp_log", &raw.jobcomp_log, &mut s.jobcomp_log), ("node_samples", &raw.node_samples, &mut s.node_samples)] {
            if let Some(v) = v {
                let p = PathBuf::from(v.get_ref());
                if p.is_absolute() {
                    *out = Some(p);
                } else {
                    self.fail(v.span(), format!("slurm `{key}` = {:?} is not an absolute path", v.get_ref()), "write e.g. \"/shared/gantry-logs\"");
                }
            }
        }
        if let Some(r) = &raw.runtime {
            match r.get_ref().as_str() {
                "docker" => s.runtime = Runtime::Docker,
                "apptainer" => s.runtime = Runtime::Apptainer,
                other => self.fail(r.span(), format!("slurm `runtime` = {other:?} is not a choice"), "write \"docker\" or \"apptainer\""),
            }
        }
        if let Some(m) = &raw.shard_memory {
            match crate::units::parse_bytes(m.get_ref()) {
                Some(b) if b >= 1 << 20 => s.shard_memory = Some(b),
                _ => self.fail(m.span(), format!("slurm `shard_memory` = {:?} is not a size", m.get_ref()), "write the GPU memory one Slurm shard stands for, e.g. \"10GiB\""),
            }
        }
        if let Some(n) = self.count("max_nice", &raw.max_nice, 2_000_000) {
            s.max_nice = n as u32;
        }
        s
    }

    fn containers(&mut self, raw: &RawContainers) -> crate::resources::Containers {
        use crate::resources::Amount;
        let mut c = crate::resources::Containers::default();
        let sizes = "write a size such as \"8GiB\"";
        if let Some(v) = &raw.shm_size {
            match (v.get_ref().as_str(), crate::units::parse_bytes(v.get_ref())) {
                ("auto", _) => {}
                (_, Some(b)) if b >= 1 << 20 => c.shm_size = Some(b),
                (s, _) => self.fail(v.span(), format!("`shm_size` = {s:?} is not \"auto\" or a size of at least 1 MiB"), format!("{sizes}, or \"auto\" (half the job's memory limit)")),
            }
        }
        for (key, v, out) in [("memlock", &raw.memlock, &mut c.memlock), ("stack", &raw.stack, &mut c.stack)] {
            if let Some(v) = v {
                match crate::units::parse_limit(v.get_ref()) {
                    Some(n) => *out = n,
                    None => self.fail(v.span(), format!("`{key}` = {:?} is not \"unlimited\" or a size", v.get_ref()), "write e.g. \"unlimited\" or \"64MiB\""),
                }
            }
        }
        if let Some(b) = &raw.allow_ipc_host {
            c.allow_ipc_host = *b.get_ref();
        }
        if let Some(h) = &raw.home {
            match h.get_ref().as_str() {
                "tmpfs" => c.home = crate::spec::Home::Tmpfs,
                "mount" => c.home = crate::spec::Home::Mount,
                other => self.fail(h.span(), format!("`home` = {other:?} is not a choice"), "write \"tmpfs\" (an empty folder per job) or \"mount\" (the user's home, read-write, checked as them)"),
            }
        }
        let cpus_hint = "write a number of CPUs (e.g. 8 or 0.5), \"auto\" (an equal share) or \"none\" (no limit)";
        let mut cpus = |key: &str, v: &S<toml::Value>, none_ok: bool| -> Option<Amount> {
            let v = v.as_ref()?;
            let n = match v.get_ref() {
                toml::Value::String(s) if s == "auto" && none_ok => return Some(Amount::Auto),
                toml::Value::String(s) if s == "none" && none_ok => return Some(Amount::Unlimited),
                toml::Value::Integer(i) => Some(*i as f64),
                toml::Value::Float(f) => Some(*f),
                _ => None,
            };
            match n {
                Some(n) if n.is_finite() && (if none_ok { 0.01 } else { 0.0 }..=1024.0).contains(&n) => Some(Amount::Is((n * 1000.0).round() as u64)),
                _ => {
                    self.fail(v.span(), format!("`{key}` = {} is not a number of CPUs from {} to 1024", v.get_ref(), if none_ok { "0.01" } else { "0" }), if none_ok { cpus_hint } else { "write e.g. 1" });
                    None
                }
            }
        };
        c.cpus_per_gpu = cpus("cpus_per_gpu", &raw.cpus_per_gpu, true).unwrap_or(c.cpus_per_gpu);
        c.cpu_only_cpus = cpus("cpu_only_cpus", &raw.cpu_only_cpus, true).unwrap_or(c.cpu_only_cpus);
        if let Some(Amount::Is(n)) = cpus("reserve_cpus", &raw.reserve_cpus, false) {
            c.reserve_cpus_milli = n;
        }
        let mut memory = |key: &str, v: &S<String>, none_ok: bool| -> Option<Amount> {
            let v = v.as_ref()?;
            match (v.get_ref().as_str(), crate::units::parse_bytes(v.get_ref())) {
                ("auto", _) if none_ok => Some(Amount::Auto),
                ("none", _) if none_ok => Some(Amount::Unlimited),
                (_, Some(b)) if b >= crate::spec::MIN_MEMORY || (!none_ok) => Some(Amount::Is(b)),
                (s, _) => {
                    self.fail(v.span(), format!("`{key}` = {s:?} is not a size{}", if none_ok { " of at least 6 MiB, \"auto\" or \"none\"" } else { "" }), "write e.g. \"64GiB\"");
                    None
                }
            }
        };
        c.memory_per_gpu = memory("memory_per_gpu", &raw.memory_per_gpu, true).unwrap_or(c.memory_per_gpu);
        c.cpu_only_memory = memory("cpu_only_memory", &raw.cpu_only_memory, true).unwrap_or(c.cpu_only_memory);
        if let Some(Amount::Is(b)) = memory("reserve_memory", &raw.reserve_memory, false) {
            c.reserve_memory = b;
        }
        c
    }

    fn gpus(&mut self, v: &Spanned<toml::Value>) -> Option<GpuChoice> {
        let hint = "write gpus = \"all\", or a list of GPU indexes or UUIDs, e.g. [0, 1, 2, 3, 4, 5, 6]";
        let (line, column) = crate::units::line_col(self.text, v.span().start);
        let list = match v.get_ref() {
            toml::Value::String(s) if s == "all" => return None,
            toml::Value::Array(a) if !a.is_empty() => a,
            other => {
                self.fail(v.span(), format!("`gpus` = {other} is not \"all\" or a list of GPUs"), hint);
                return None;
            }
        };
        let mut gpus = vec![];
        for item in list {
            let g = match item {
                toml::Value::Integer(i) if (0..=1024).contains(i) => GpuRef::Index(*i as u32),
                toml::Value::String(s) if s.starts_with("GPU-") || s.starts_with("MIG-") => GpuRef::Uuid(s.clone()),
                other => {
                    self.fail(v.span(), format!("`gpus` lists {other}, which is neither a GPU index nor a GPU UUID"), hint);
                    return None;
                }
            };
            if gpus.contains(&g) {
                self.fail(v.span(), format!("`gpus` lists GPU {g} twice"), "list each GPU once");
                return None;
            }
            gpus.push(g);
        }
        Some(GpuChoice { gpus, file: self.file.to_path_buf(), line, column })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
[history]
keep = "365d"
[inbox]
group = "gantry"
path = "Gantry/inbox"
templates = "/etc/gantry/templates"
"#;
        let c = parse(full).unwrap();
        let p = &c.policy;
        assert_eq!((p.user_priority, p.admin_priority, p.max_queued_per_user, p.max_running_gpus), ((-5, 5), (-100, 100), 10, Some(4)));
        assert_eq!(p.default_timeout, Some(Duration::from_secs(7 * 86400)));
        assert_eq!((p.log_cap, p.see_others, p.admin_gid), (1 << 30, SeeOthers::All, Some(0)));
        assert_eq!(p.log_keep, Some(Duration::from_secs(90 * 86400)));
        assert_eq!(c.gpus.as_ref().unwrap().gpus.len(), 3);
        assert_eq!((c.inbox_path.as_deref(), c.inbox_group.as_deref()), (Some(Path::new("Gantry/inbox")), Some("gantry")));
        let d = parse("").unwrap();
        assert_eq!(d.policy, Policy::default());
        assert_eq!(d.gpus, None);
        assert_eq!(parse("gpus = \"all\"\n").unwrap().gpus, None);
    }

    #[test]
    fn problems_name_the_file_line_and_column_and_how_to_fix() {
        let cases: &[(&str, &str)] = &[
            ("[limits]\nmax_queud_jobs = 3\n", "config.toml:2:1: unknown field `max_queud_jobs`"),
            ("[limits]\npriority = [10, -10]\n", "config.toml:2:12: `priority` = [10, -10]: the lowest value is above the highest; swap them: [-10, 10]"),
            ("[limits]\ndefault_timeout = \"40d\"\nmax_timeout = \"30d\"\n", "config.toml:2:19: `default_timeout` (40d) is longer than `max_timeout` (30d)"),
            ("[access]\nadmins = [\"root\", \"nosuchuser-x\"]\n", "config.toml:2:19: `admins` names \"nosuchuser-x\", which is not a user"),
            ("[access]\nadmin_group = \"nosuchgroup-x\"\n", "config.toml:2:15: `admin_group` = \"nosuchgroup-x\" is not a group"),
            ("[access]\nsee_others = \"some\"\n", "`see_others` = \"some\" is not a choice"),
            ("[logs]\ncap = \"lots\"\n", "config.toml:2:7: `cap` = \"lots\" is not a size"),
            ("[jobs]\nstop_grace = \"soon\"\n", "`stop_grace` = \"soon\" is not a duration"),
            ("gpus = [0, 0]\n", "GPU 0 twice"),
            ("gpus = \"some\"\n", "config.toml:1:8: `gpus` = \"some\" is not \"all\""),
            ("[limits]\nmax_running_gpus = 0\n", "`max_running_gpus` = 0 is out of range"),
            ("[limits]\nmax_queued_jobs = \"many\"\n", "config.toml:2:19: invalid type: string \"many\", expected i64"),
            ("[inbox]\npath = \"../x\"\n", "not a plain path"),
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
        let c = parse("[containers]\nshm_size = \"16GiB\"\nmemlock = \"unlimited\"\nstack = \"32MiB\"\nallow_ipc_host = true\nhome = \"mount\"\ncpus_per_gpu = 8\nmemory_per_gpu = \"64GiB\"\ncpu_only_cpus = 0.5\ncpu_only_memory = \"none\"\nreserve_cpus = 2\nreserve_memory = \"4GiB\"\n").unwrap().policy.containers;
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
            }
        );
        assert_eq!(parse("[containers]\nshm_size = \"auto\"\ncpus_per_gpu = \"auto\"\n").unwrap().policy.containers, Containers::default());
        let cases: &[(&str, &str)] = &[
            ("[containers]\nshm = \"1GiB\"\n", "config.toml:2:1: unknown field `shm`"),
            ("[containers]\nshm_size = \"lots\"\n", "config.toml:2:12: `shm_size` = \"lots\" is not \"auto\" or a size"),
            ("[containers]\nmemlock = \"-1\"\n", "`memlock` = \"-1\" is not \"unlimited\" or a size"),
            ("[containers]\nhome = \"nfs\"\n", "`home` = \"nfs\" is not a choice; write \"tmpfs\""),
            ("[containers]\ncpus_per_gpu = 0\n", "config.toml:2:16: `cpus_per_gpu` = 0 is not a number of CPUs from 0.01 to 1024"),
            ("[containers]\ncpus_per_gpu = \"many\"\n", "is not a number of CPUs"),
            ("[containers]\nmemory_per_gpu = \"1KiB\"\n", "`memory_per_gpu` = \"1KiB\" is not a size of at least 6 MiB"),
            ("[containers]\nreserve_cpus = \"auto\"\n", "`reserve_cpus` = \"auto\" is not a number of CPUs from 0 to 1024"),
            ("[containers]\nallow_ipc_host = \"yes\"\n", "config.toml:2:18: invalid type: string \"yes\", expected a boolean"),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.contains(want), "{text:?}\n  got:  {e}\n  want: {want}");
        }
        let changed = parse("[containers]\nallow_ipc_host = true\n").unwrap().policy.changes_from(&Policy::default());
        assert_eq!(changed, vec!["containers.allow_ipc_host: false -> true"]);
    }

    #[test]
    fn gpus_resolve_against_the_machine_by_index_or_uuid() {
        let inv: Vec<(u32, String)> = (0..4).map(|i| (i, format!("GPU-{i}"))).collect();
        let c = parse("\n\ngpus = [0, \"GPU-3\"]\n").unwrap();
        assert_eq!(c.gpus.as_ref().unwrap().resolve(&inv).unwrap(), BTreeSet::from([0, 3]));
        let c = parse("gpus = [0, 7]\n").unwrap();
        let e = c.gpus.unwrap().resolve(&inv).unwrap_err().to_string();
        assert!(e.starts_with("/etc/gantry/config.toml:1:8: `gpus` names GPU 7, which this machine does not have"), "{e}");
        assert!(e.contains("0 (GPU-0), 1 (GPU-1)"), "{e}");
    }

    #[test]
    fn admins_and_what_they_may_do() {
        let p = Policy::default();
        assert!(p.is_admin(0) && !p.is_admin(4242));
        assert_eq!((p.priority_range(0), p.priority_range(4242)), (config::ADMIN_PRIORITY, config::USER_PRIORITY));
        assert!(p.may_see_private(4242, 4242) && p.may_see_private(0, 4242) && !p.may_see_private(4243, 4242));
        let all = Policy { see_others: SeeOthers::All, ..Policy::default() };
        assert!(all.may_see_private(4243, 4242));
        // The root group's members (gid 0 is root's primary group) are admins.
        let g = parse("[access]\nadmin_group = \"root\"\n").unwrap().policy;
        assert_eq!(g.admin_gid, Some(0));
        let changes = g.changes_from(&p);
        assert!(changes.iter().any(|c| c.starts_with("access.admin_group: None -> Some(\"root\")")), "{changes:?}");
    }

    /// The packaged /etc/gantry/config.toml is valid as shipped, and every key it documents (the
    /// commented `#key = value` lines) is one the engine reads, with a valid example value.
    #[test]
    fn the_packaged_config_is_valid_and_documents_only_real_keys() {
        let shipped = include_str!("../../../packaging/config.toml").replace("\"gantry-admins\"", "\"root\"");
        let path = Path::new("/etc/gantry/config.toml");
        LabConfig::parse(&shipped, path).unwrap_or_else(|e| panic!("as shipped: {e}"));
        let mut documented = 0;
        let all: String = shipped
            .lines()
            .map(|l| match l.strip_prefix('#') {
                Some(kv) if kv.split_once(" = ").is_some_and(|(k, _)| !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_')) => {
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