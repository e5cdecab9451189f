//! Reading the lab config file: TOML with positions, every key checked (`Check`), problems reported
//! all at once with line and column, then turned into a [`super::Policy`] and [`super::LabConfig`].

#[allow(unused_imports)]
use super::*;
use crate::defaults as config;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml::Spanned;

impl LabConfig {
    /// Read and check `file`. A missing file means the defaults when `missing_ok` (the system
    /// engine's `/etc/gantry/config.toml`), and is an error otherwise (`--config FILE`).
    pub fn load(file: &Path, missing_ok: bool) -> Result<LabConfig, PolicyError> {
        use std::io::Read;
        let opened = std::fs::File::open(file);
        let text = match opened {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && missing_ok => return Ok(LabConfig::default()),
            Err(e) => {
                return Err(PolicyError::file(
                    file,
                    format!("cannot read it: {e}"),
                    "check the path and that the engine's user may read it",
                ))
            }
            Ok(f) => {
                let mut s = String::new();
                f.take(MAX_CONFIG_BYTES + 1)
                    .read_to_string(&mut s)
                    .map_err(|e| PolicyError::file(file, format!("cannot read it: {e}"), "save it as UTF-8 text"))?;
                if s.len() as u64 > MAX_CONFIG_BYTES {
                    return Err(PolicyError::file(
                        file,
                        "it is larger than 1 MiB".into(),
                        "a lab config is a page of settings; check that this is the right file",
                    ));
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
            let (line, column) = e
                .span()
                .map(|s| crate::units::line_col(text, s.start))
                .unwrap_or((0, 0));
            let msg = e.message().trim().to_string();
            let hint = if msg.contains("unknown field") {
                "remove or rename the key; the packaged /etc/gantry/config.toml documents every key"
            } else {
                "fix the value's type or syntax; the packaged /etc/gantry/config.toml shows each key with an example"
            };
            PolicyError::at(file, line, column, msg, hint.into())
        })?;
        let mut c = Check {
            text,
            file,
            problems: vec![],
        };
        let lab = c.build(raw);
        if c.problems.is_empty() {
            Ok(LabConfig {
                file: Some(file.to_path_buf()),
                ..lab
            })
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
        if self.notify != old.notify {
            out.push("notify");
        }
        if self.metrics != old.metrics {
            out.push("metrics");
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
            write!(
                f,
                "{}:{}:{}: {}; {}",
                self.file.display(),
                self.line,
                self.column,
                self.message,
                self.hint
            )
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
    pub(super) fn at(file: &Path, line: usize, column: usize, message: String, hint: String) -> PolicyError {
        PolicyError {
            problems: vec![Problem {
                file: file.to_path_buf(),
                line,
                column,
                message,
                hint,
            }],
        }
    }
    pub(super) fn file(file: &Path, message: String, hint: &str) -> PolicyError {
        Self::at(file, 0, 0, message, hint.into())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
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
    preemption: RawPreemption,
    #[serde(default)]
    logs: RawLogs,
    #[serde(default)]
    history: RawHistory,
    #[serde(default)]
    inbox: RawInbox,
    #[serde(default)]
    containers: RawContainers,
    #[serde(default)]
    images: RawImages,
    #[serde(default)]
    disk: RawDisk,
    backend: S<String>,
    #[serde(default)]
    slurm: RawSlurm,
    #[serde(default)]
    sessions: RawSessions,
    #[serde(default)]
    bookings: RawBookings,
    #[serde(default)]
    notify: RawNotify,
    #[serde(default)]
    metrics: RawMetrics,
    #[serde(default)]
    results: RawResults,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawResults {
    max_points: S<i64>,
    max_series: S<i64>,
    max_name_len: S<i64>,
    max_bytes_per_job: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSessions {
    max_gpus: S<i64>,
    default_length: S<String>,
    max_length: S<String>,
    before_batch: S<bool>,
    notebook_image: S<String>,
    idle_after: S<String>,
    idle_batch: S<bool>,
    keep_free: S<i64>,
    forward_port: S<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBookings {
    enabled: S<bool>,
    max_gpu_hours_per_week: S<i64>,
    max_ahead: S<String>,
    max_length: S<String>,
    slot: S<String>,
    release_after: S<String>,
    max_gpus: S<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNotify {
    smtp_host: S<String>,
    smtp_port: S<i64>,
    smtp_starttls: S<bool>,
    smtp_from: S<String>,
    smtp_credentials: S<String>,
    webhook_hosts: S<Vec<Spanned<String>>>,
    webhooks: S<Vec<Spanned<RawLabHook>>>,
    max_tries: S<i64>,
    retry_backoff: S<String>,
    max_pending: S<i64>,
    max_targets: S<i64>,
    max_tests_per_hour: S<i64>,
    email_domains: S<Vec<Spanned<String>>>,
    email_to: S<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLabHook {
    url: Spanned<String>,
    #[serde(default)]
    on: Vec<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetrics {
    listen: S<String>,
    allow_remote: S<bool>,
    max_connections: S<i64>,
    idle_timeout: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSlurm {
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
pub(super) struct RawContainers {
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
    pids_limit: S<i64>,
    host_image: S<bool>,
}

pub(super) type S<T> = Option<Spanned<T>>;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAccess {
    admins: S<Vec<Spanned<String>>>,
    admin_group: S<String>,
    see_others: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    priority: S<Vec<i64>>,
    admin_priority: S<Vec<i64>>,
    max_queued_jobs: S<i64>,
    max_running_gpus: S<i64>,
    default_timeout: S<String>,
    max_timeout: S<String>,
    max_begin: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFairShare {
    half_life: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJobs {
    stop_grace: S<String>,
    retry_backoff: S<String>,
    reserve_after: S<String>,
    gpu_memory_margin: S<String>,
    gpu_memory_grace: S<String>,
    overrun_margin: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPreemption {
    enabled: S<bool>,
    default_preemptible: S<bool>,
    reserve_after: S<bool>,
    priority_gap: S<i64>,
    fair_share: S<bool>,
    min_run: S<String>,
    max_per_day: S<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLogs {
    cap: S<String>,
    keep: S<String>,
    streams_per_user: S<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHistory {
    keep: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawImages {
    allow: S<Vec<Spanned<String>>>,
    pull_timeout: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDisk {
    min_free: S<String>,
    layer_size: S<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawInbox {
    group: S<String>,
    path: S<String>,
    templates: S<String>,
    max_watches: S<i64>,
}

/// Collects every problem (not just the first), each at its value's line and column.
pub(super) struct Check<'a> {
    text: &'a str,
    file: &'a Path,
    problems: Vec<Problem>,
}

impl Check<'_> {
    pub(super) fn fail(&mut self, span: Range<usize>, message: String, hint: impl Into<String>) {
        let (line, column) = crate::units::line_col(self.text, span.start);
        self.problems.push(Problem {
            file: self.file.to_path_buf(),
            line,
            column,
            message,
            hint: hint.into(),
        });
    }

    pub(super) fn duration(&mut self, key: &str, v: &S<String>, max: Duration) -> Option<Duration> {
        let v = v.as_ref()?;
        match humantime::parse_duration(v.get_ref().trim()) {
            Ok(d) if d > Duration::ZERO && d <= max => Some(d),
            Ok(d) if d > max => {
                self.fail(
                    v.span(),
                    format!("`{key}` = {:?} is longer than {}", v.get_ref(), human(max)),
                    format!("use at most \"{}\"", human(max)),
                );
                None
            }
            _ => {
                self.fail(
                    v.span(),
                    format!("`{key}` = {:?} is not a duration", v.get_ref()),
                    "write e.g. \"10s\", \"30m\", \"24h\" or \"7d\"",
                );
                None
            }
        }
    }

    pub(super) fn range(&mut self, key: &str, v: &S<Vec<i64>>) -> Option<(i32, i32)> {
        let v = v.as_ref()?;
        let hint = "write [lowest, highest], e.g. [-10, 10]";
        match v.get_ref().as_slice() {
            [lo, hi] if i32::try_from(*lo).is_err() || i32::try_from(*hi).is_err() => {
                self.fail(
                    v.span(),
                    format!("`{key}` = [{lo}, {hi}] is outside what a priority can hold"),
                    format!("use values from {} to {}", i32::MIN, i32::MAX),
                );
                None
            }
            [lo, hi] if lo > hi => {
                self.fail(
                    v.span(),
                    format!("`{key}` = [{lo}, {hi}]: the lowest value is above the highest"),
                    format!("swap them: [{hi}, {lo}]"),
                );
                None
            }
            [lo, hi] => Some((*lo as i32, *hi as i32)),
            other => {
                self.fail(v.span(), format!("`{key}` has {} values, not 2", other.len()), hint);
                None
            }
        }
    }

    pub(super) fn count(&mut self, key: &str, v: &S<i64>, max: i64) -> Option<i64> {
        let v = v.as_ref()?;
        let n = *v.get_ref();
        if n < 1 || n > max {
            self.fail(
                v.span(),
                format!("`{key}` = {n} is out of range"),
                format!("use a number from 1 to {max}, or leave `{key}` out"),
            );
            return None;
        }
        Some(n)
    }

    pub(super) fn build(&mut self, raw: RawFile) -> LabConfig {
        let mut p = Policy::default();
        // [access]
        if let Some(admins) = &raw.access.admins {
            p.admins = vec![];
            for name in admins.get_ref() {
                match nix::unistd::User::from_name(name.get_ref()) {
                    Ok(Some(u)) => {
                        p.admin_uids.insert(u.uid.as_raw());
                    }
                    _ => self.fail(
                        name.span(),
                        format!(
                            "`admins` names {:?}, which is not a user on this machine",
                            name.get_ref()
                        ),
                        "check the spelling (`getent passwd NAME`), or remove the name",
                    ),
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
                _ => self.fail(
                    g.span(),
                    format!("`admin_group` = {:?} is not a group on this machine", g.get_ref()),
                    "create it (`groupadd NAME`, then `usermod -aG NAME USER`), or remove `admin_group`",
                ),
            }
        }
        if let Some(s) = &raw.access.see_others {
            match s.get_ref().as_str() {
                "queue" => p.see_others = SeeOthers::Queue,
                "all" => p.see_others = SeeOthers::All,
                other => self.fail(
                    s.span(),
                    format!("`see_others` = {other:?} is not a choice"),
                    "write \"queue\" (other users' queue rows only) or \"all\" (their specs and logs too)",
                ),
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
        p.max_running_gpus = self
            .count("max_running_gpus", &raw.limits.max_running_gpus, 1024)
            .map(|n| n as u32);
        p.default_timeout = self.duration(
            "default_timeout",
            &raw.limits.default_timeout,
            crate::spec::MAX_DURATION,
        );
        p.max_timeout = self.duration("max_timeout", &raw.limits.max_timeout, crate::spec::MAX_DURATION);
        if let Some(d) = self.duration("max_begin", &raw.limits.max_begin, crate::spec::MAX_DURATION) {
            p.max_begin = d;
        }
        if let (Some(d), Some(m), Some(at)) = (p.default_timeout, p.max_timeout, &raw.limits.default_timeout) {
            if d > m {
                self.fail(
                    at.span(),
                    format!(
                        "`default_timeout` ({}) is longer than `max_timeout` ({})",
                        human(d),
                        human(m)
                    ),
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
        if let Some(d) = self.duration("overrun_margin", &raw.jobs.overrun_margin, day) {
            p.overrun_margin = d;
        }
        // [preemption]
        let pr = &raw.preemption;
        let flag = |v: &S<bool>, d: bool| v.as_ref().map_or(d, |b| *b.get_ref());
        p.preemption.enabled = flag(&pr.enabled, p.preemption.enabled);
        p.preemption.default_preemptible = flag(&pr.default_preemptible, p.preemption.default_preemptible);
        p.preemption.rules.overdue = flag(&pr.reserve_after, p.preemption.rules.overdue);
        p.preemption.rules.fair_share = flag(&pr.fair_share, p.preemption.rules.fair_share);
        if let Some(g) = &pr.priority_gap {
            match *g.get_ref() {
                0 => p.preemption.rules.priority_gap = None,
                n @ 1..=2000 => p.preemption.rules.priority_gap = Some(n as i32),
                n => self.fail(g.span(), format!("`priority_gap` = {n} is out of range"), "use a number from 1 to 2000 (how far above a preemptible job's priority a job must be to preempt it), or 0 to turn the priority rule off"),
            }
        }
        if let Some(d) = self.duration("min_run", &pr.min_run, day) {
            p.preemption.rules.min_run_ms = d.as_millis() as i64;
        }
        if let Some(n) = self.count("max_per_day", &pr.max_per_day, 1000) {
            p.preemption.rules.max_per_day = n as u32;
        }
        if let Some(v) = &raw.jobs.gpu_memory_margin {
            match v
                .get_ref()
                .trim()
                .strip_suffix('%')
                .and_then(|n| n.trim().parse::<f64>().ok())
                .filter(|n| n.is_finite() && (0.0..=1000.0).contains(n))
            {
                Some(n) => p.gpu_memory_margin_pct = n,
                None => self.fail(
                    v.span(),
                    format!(
                        "`gpu_memory_margin` = {:?} is not a percentage from 0% to 1000%",
                        v.get_ref()
                    ),
                    "write e.g. \"20%\" (how much more GPU memory than its `gpu_memory` a job may use)",
                ),
            }
        }
        if let Some(d) = self.duration("gpu_memory_grace", &raw.jobs.gpu_memory_grace, day) {
            p.gpu_memory_grace = d;
        }
        // [logs], [history]
        if let Some(c) = &raw.logs.cap {
            match crate::units::parse_bytes(c.get_ref()) {
                Some(b) if b >= 4096 => p.log_cap = b,
                _ => self.fail(
                    c.span(),
                    format!("`cap` = {:?} is not a size of at least 4 KiB", c.get_ref()),
                    "write e.g. \"64MiB\" or \"1GiB\"",
                ),
            }
        }
        p.log_keep = self.duration("keep", &raw.logs.keep, 100 * 365 * day);
        if let Some(n) = self.count("streams_per_user", &raw.logs.streams_per_user, 1024) {
            p.log_streams_per_user = n as usize;
        }
        if let Some(n) = self.count("max_watches", &raw.inbox.max_watches, 65_536) {
            p.inbox_watches_per_user = n as usize;
        }
        p.history_keep = self.duration("keep", &raw.history.keep, 100 * 365 * day);
        p.containers = self.containers(&raw.containers);
        // [disk]
        if let Some(v) = &raw.disk.min_free {
            match MinFree::parse(v.get_ref()) {
                Some(m) => p.disk.min_free = m,
                None => self.fail(
                    v.span(),
                    format!("disk `min_free` = {:?} is not a size or a percentage", v.get_ref()),
                    "write e.g. \"10GiB\" or \"5%\" (of Docker's disk); \"0\" turns the watch off",
                ),
            }
        }
        if let Some(v) = &raw.disk.layer_size {
            match (v.get_ref().trim(), crate::units::parse_bytes(v.get_ref())) {
                ("none", _) => p.disk.layer_size = None,
                (_, Some(b)) if b >= 1 << 30 => p.disk.layer_size = Some(b),
                (s, _) => self.fail(
                    v.span(),
                    format!("disk `layer_size` = {s:?} is not a size of at least 1 GiB or \"none\""),
                    "write e.g. \"100GiB\" (what one job may write inside its container), or \"none\"",
                ),
            }
        }
        // [images]
        if let Some(allow) = &raw.images.allow {
            let mut list = vec![];
            for pat in allow.get_ref() {
                let v = pat.get_ref().trim();
                if v.is_empty() || v.chars().any(|c| c.is_whitespace() || c.is_control()) || v.contains("://") {
                    self.fail(pat.span(), format!("images `allow` lists {:?}, which is not an image pattern", pat.get_ref()), "write an image name with `*` for any part, e.g. \"registry.lab.example/*\" or \"pytorch/*\" (no scheme, no spaces)");
                } else {
                    list.push(v.to_string());
                }
            }
            p.images.allow = Some(list);
        }
        if let Some(d) = self.duration("pull_timeout", &raw.images.pull_timeout, day) {
            p.images.pull_timeout = d;
        }
        p.sessions = self.sessions(&raw.sessions);
        p.bookings = self.bookings(&raw.bookings);
        p.results = self.results(&raw.results);
        // Restart-only settings.
        let gpus = raw.gpus.as_ref().and_then(|g| self.gpus(g));
        if let Some(s) = &raw.simulate {
            if let Err(e) = crate::gpu::SimulatedBackend::from_spec(s.get_ref()) {
                self.fail(
                    s.span(),
                    e.to_string(),
                    "or remove `simulate` to use the machine's GPUs",
                );
            }
        }
        let inbox_path = raw.inbox.path.as_ref().and_then(|v| {
            let p = PathBuf::from(v.get_ref());
            if p.is_absolute()
                || p.components().any(|c| !matches!(c, std::path::Component::Normal(_)))
                || v.get_ref().is_empty()
            {
                self.fail(
                    v.span(),
                    format!(
                        "inbox `path` = {:?} is not a plain path inside a user's home",
                        v.get_ref()
                    ),
                    "write a relative path without `..`, e.g. \"Gantry/inbox\"",
                );
                return None;
            }
            Some(p)
        });
        let templates_dir = raw.inbox.templates.as_ref().and_then(|v| {
            let p = PathBuf::from(v.get_ref());
            if !p.is_absolute() {
                self.fail(
                    v.span(),
                    format!("inbox `templates` = {:?} is not an absolute path", v.get_ref()),
                    "write e.g. \"/etc/gantry/templates\"",
                );
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
        let notify = self.notify(&raw.notify);
        let metrics = self.metrics(&raw.metrics);
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
            notify,
            metrics,
        }
    }

    /// `[results]`: the bounds on each job's metrics.
    pub(super) fn results(&mut self, raw: &RawResults) -> crate::store::ResultsLimits {
        let mut r = crate::store::ResultsLimits::default();
        if let Some(n) = self.count("max_points", &raw.max_points, 1_000_000) {
            r.max_points = (n as u32).max(16);
        }
        if let Some(n) = self.count("max_series", &raw.max_series, 100_000) {
            r.max_series = n as u32;
        }
        if let Some(n) = self.count("max_name_len", &raw.max_name_len, 4096) {
            r.max_name_len = n as u32;
        }
        if let Some(v) = &raw.max_bytes_per_job {
            match crate::units::parse_bytes(v.get_ref()) {
                Some(b) if b >= 4096 => r.max_bytes = b,
                _ => self.fail(
                    v.span(),
                    format!(
                        "results `max_bytes_per_job` = {:?} is not a size of at least 4 KiB",
                        v.get_ref()
                    ),
                    "write e.g. \"256MiB\" or \"1GiB\" (bytes of metric and event files read per job)",
                ),
            }
        }
        r
    }

    pub(super) fn bookings(&mut self, raw: &RawBookings) -> super::Bookings {
        let mut b = super::Bookings::default();
        if let Some(e) = &raw.enabled {
            b.enabled = *e.get_ref();
        }
        // 0 turns the weekly limit off (the built-in default is a limit: a fresh machine is bounded).
        if raw.max_gpu_hours_per_week.as_ref().is_some_and(|v| *v.get_ref() == 0) {
            b.max_gpu_hours_per_week = None;
        } else if let Some(n) = self.count("max_gpu_hours_per_week", &raw.max_gpu_hours_per_week, 100_000) {
            b.max_gpu_hours_per_week = Some(n as u32);
        }
        b.max_gpus = self.count("max_gpus", &raw.max_gpus, 1024).map(|n| n as u32);
        let year = Duration::from_secs(366 * 24 * 3600);
        let day = Duration::from_secs(24 * 3600);
        if let Some(d) = self.duration("max_ahead", &raw.max_ahead, year) {
            b.max_ahead = d;
        }
        if let Some(d) = self.duration("release_after", &raw.release_after, day) {
            b.release_after = d;
        }
        let month = Duration::from_secs(31 * 24 * 3600);
        if let Some(d) = self.duration("max_length", &raw.max_length, month) {
            b.max_length = d;
        }
        if let (Some(v), Some(d)) = (&raw.slot, self.duration("slot", &raw.slot, day)) {
            let secs = d.as_secs();
            if d.subsec_nanos() != 0 || secs % 60 != 0 || (24 * 3600) % secs != 0 {
                self.fail(
                    v.span(),
                    format!(
                        "bookings `slot` = {:?} is not a whole number of minutes that divides a day",
                        v.get_ref()
                    ),
                    "use e.g. \"15m\", \"30m\", \"1h\" or \"2h\"",
                );
            } else {
                b.slot = d;
            }
        }
        b
    }

    pub(super) fn sessions(&mut self, raw: &RawSessions) -> Sessions {
        let mut s = Sessions::default();
        // 0 turns the limit off (the built-in default is a limit: a session jumps the queue).
        if raw.max_gpus.as_ref().is_some_and(|v| *v.get_ref() == 0) {
            s.max_gpus = None;
        } else if let Some(n) = self.count("max_gpus", &raw.max_gpus, 1024) {
            s.max_gpus = Some(n as u32);
        }
        let week = Duration::from_secs(7 * 24 * 3600);
        if let Some(d) = self.duration("max_length", &raw.max_length, week) {
            s.max_length = d;
        }
        if let Some(d) = self.duration("default_length", &raw.default_length, week) {
            s.default_length = d;
        }
        if s.default_length > s.max_length {
            let at = raw
                .default_length
                .as_ref()
                .or(raw.max_length.as_ref())
                .map(|v| v.span())
                .unwrap_or(0..0);
            self.fail(
                at,
                format!(
                    "sessions `default_length` ({}) is longer than `max_length` ({})",
                    human(s.default_length),
                    human(s.max_length)
                ),
                "lower `default_length` or raise `max_length`",
            );
        }
        if let Some(b) = &raw.before_batch {
            s.before_batch = *b.get_ref();
        }
        if let Some(i) = &raw.notebook_image {
            let name = i.get_ref().trim();
            if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
                self.fail(
                    i.span(),
                    format!("sessions `notebook_image` = {:?} is not an image name", i.get_ref()),
                    "write an image with `jupyter lab` in it, e.g. \"quay.io/jupyter/pytorch-notebook:cuda12-latest\"",
                );
            } else {
                s.notebook_image = Some(name.to_string());
            }
        }
        if let Some(v) = &raw.idle_after {
            if v.get_ref().trim() == "none" {
                s.idle_after = None;
            } else if let Some(d) = self.duration("idle_after", &raw.idle_after, week) {
                s.idle_after = Some(d);
            }
        }
        if let Some(b) = &raw.idle_batch {
            s.idle_batch = *b.get_ref();
        }
        if let Some(v) = &raw.keep_free {
            if *v.get_ref() == 0 {
                s.keep_free = 0;
            } else if let Some(n) = self.count("keep_free", &raw.keep_free, 1024) {
                s.keep_free = n as u32;
            }
        }
        if let Some(v) = &raw.forward_port {
            match u16::try_from(*v.get_ref()) {
                Ok(p) if (1..1024).contains(&p) => s.forward_port = p,
                _ => self.fail(
                    v.span(),
                    format!("sessions `forward_port` = {} is not a port below 1024", v.get_ref()),
                    "only root may bind a port below 1024, so no other user can answer a forward's URL: use one \
                     no service here listens on, e.g. 1021",
                ),
            }
        }
        s
    }

    pub(super) fn notify(&mut self, raw: &RawNotify) -> NotifySettings {
        use crate::protocol::notify::NotifyEvent;
        let mut n = NotifySettings::default();
        if let Some(hosts) = &raw.webhook_hosts {
            for h in hosts.get_ref() {
                match crate::notify::check::host_entry(h.get_ref()) {
                    Ok(e) => n.webhook_hosts.push(e),
                    Err(why) => self.fail(h.span(), format!("`webhook_hosts` lists {:?}: {why}", h.get_ref()), "write a host name (\"hooks.slack.com\"), \"*.lab.org\" or an IP address, optionally with \":PORT\""),
                }
            }
        }
        for hook in raw.webhooks.iter().flat_map(|w| w.get_ref()) {
            let h = hook.get_ref();
            if let Err(why) = crate::notify::check::url_syntax(h.url.get_ref()) {
                self.fail(
                    h.url.span(),
                    format!("a lab webhook's `url` = {:?} {why}", h.url.get_ref()),
                    "write e.g. \"https://chat.lab.org/hooks/abc\"",
                );
                continue;
            }
            let mut on = vec![];
            for e in &h.on {
                match NotifyEvent::parse(e.get_ref()).filter(|e| *e != NotifyEvent::Test) {
                    Some(ev) => on.push(ev),
                    None => self.fail(
                        e.span(),
                        format!("a lab webhook's `on` lists {:?}, which is not an event", e.get_ref()),
                        format!("use some of: {}", NotifyEvent::names()),
                    ),
                }
            }
            if h.on.is_empty() {
                on = vec![NotifyEvent::StoreProblem];
            }
            n.webhooks.push((h.url.get_ref().clone(), on));
        }
        if let Some(t) = self.count("max_tries", &raw.max_tries, 100) {
            n.max_tries = t as u32;
        }
        if let Some(d) = self.duration("retry_backoff", &raw.retry_backoff, config::NOTIFY_BACKOFF_MAX) {
            n.retry_backoff = d;
        }
        if let Some(m) = self.count("max_pending", &raw.max_pending, 100_000) {
            n.max_pending = m as usize;
        }
        if let Some(m) = self.count("max_targets", &raw.max_targets, 1000) {
            n.max_targets = m as usize;
        }
        if let Some(m) = self.count("max_tests_per_hour", &raw.max_tests_per_hour, 1000) {
            n.max_tests_per_hour = m as usize;
        }
        if let Some(list) = &raw.email_domains {
            let mut domains = vec![];
            for d in list.get_ref() {
                let v = d.get_ref().trim().trim_start_matches('@').to_ascii_lowercase();
                if crate::notify::check::email(&format!("x@{v}")).is_err() {
                    self.fail(
                        d.span(),
                        format!("`email_domains` lists {:?}, which is not a mail domain", d.get_ref()),
                        "write e.g. \"lab.org\"",
                    );
                } else {
                    domains.push(v);
                }
            }
            n.email_domains = Some(domains);
        }
        match raw.email_to.as_ref().map(|v| (v.get_ref().as_str(), v.span())) {
            None | Some(("own", _)) => n.email_to = super::EmailTo::Own,
            Some(("domains", _)) => n.email_to = super::EmailTo::Domains,
            Some((other, span)) => self.fail(span, format!("`email_to` = {other:?} is not a choice"), "write \"own\" (a user adds only <login name>@ a listed domain) or \"domains\" (any address at a listed domain)"),
        }
        let starttls = raw.smtp_starttls.as_ref().map(|b| *b.get_ref()).unwrap_or(true);
        let port = match &raw.smtp_port {
            Some(p) if (1..=65535).contains(p.get_ref()) => *p.get_ref() as u16,
            Some(p) => {
                self.fail(
                    p.span(),
                    format!("`smtp_port` = {} is not a port", p.get_ref()),
                    "write e.g. 587 (submission with STARTTLS) or 25",
                );
                0
            }
            None if starttls => 587,
            None => 25,
        };
        match (&raw.smtp_host, &raw.smtp_from) {
            (Some(host), Some(from)) => {
                if host.get_ref().trim().is_empty() || host.get_ref().chars().any(|c| c.is_whitespace() || c == '/') {
                    self.fail(
                        host.span(),
                        format!("`smtp_host` = {:?} is not a host name", host.get_ref()),
                        "write the relay's name, e.g. \"smtp.lab.org\"",
                    );
                }
                if crate::notify::check::email(from.get_ref()).is_err() {
                    self.fail(
                        from.span(),
                        format!("`smtp_from` = {:?} is not an email address", from.get_ref()),
                        "write e.g. \"gantry@lab.org\"",
                    );
                }
                let credentials = raw.smtp_credentials.as_ref().and_then(|c| {
                    let p = PathBuf::from(c.get_ref());
                    if p.is_absolute() {
                        Some(p)
                    } else {
                        self.fail(
                            c.span(),
                            format!("`smtp_credentials` = {:?} is not an absolute path", c.get_ref()),
                            "write e.g. \"/etc/gantry/smtp-credentials\" (mode 600, owned by root)",
                        );
                        None
                    }
                });
                n.smtp = Some(SmtpSettings {
                    host: host.get_ref().trim().to_string(),
                    port,
                    starttls,
                    from: from.get_ref().clone(),
                    credentials,
                });
            }
            (Some(host), None) => self.fail(
                host.span(),
                "`smtp_host` is set but `smtp_from` is not".into(),
                "add smtp_from = \"gantry@YOUR.DOMAIN\" (the sender of notification emails)",
            ),
            (None, Some(from)) => self.fail(
                from.span(),
                "`smtp_from` is set but `smtp_host` is not".into(),
                "add smtp_host = \"smtp.YOUR.DOMAIN\" (the relay to send through)",
            ),
            (None, None) => {
                for (key, span) in [
                    ("smtp_port", raw.smtp_port.as_ref().map(|v| v.span())),
                    ("smtp_starttls", raw.smtp_starttls.as_ref().map(|v| v.span())),
                    ("smtp_credentials", raw.smtp_credentials.as_ref().map(|v| v.span())),
                ] {
                    if let Some(span) = span {
                        self.fail(
                            span,
                            format!("`{key}` is set but `smtp_host` is not"),
                            "add smtp_host and smtp_from, or remove it",
                        );
                    }
                }
            }
        }
        n
    }

    pub(super) fn metrics(&mut self, raw: &RawMetrics) -> MetricsSettings {
        let mut m = MetricsSettings {
            allow_remote: raw.allow_remote.as_ref().map(|b| *b.get_ref()).unwrap_or(false),
            ..MetricsSettings::default()
        };
        if let Some(n) = self.count("max_connections", &raw.max_connections, 100_000) {
            m.max_connections = n as usize;
        }
        if let Some(d) = self.duration("idle_timeout", &raw.idle_timeout, Duration::from_secs(3600)) {
            m.idle_timeout = d;
        }
        if let Some(l) = &raw.listen {
            match l.get_ref().parse::<std::net::SocketAddr>() {
                Ok(a) if !a.ip().is_loopback() && !m.allow_remote => self.fail(
                    l.span(),
                    format!("metrics `listen` = {:?} is not a loopback address", l.get_ref()),
                    "anyone who can reach it sees each user's GPU use: listen on \"127.0.0.1:9464\" (and let a local Prometheus or proxy scrape it), or set allow_remote = true",
                ),
                Ok(a) => m.listen = Some(a),
                Err(_) => self.fail(l.span(), format!("metrics `listen` = {:?} is not an address and port", l.get_ref()), "write e.g. \"127.0.0.1:9464\""),
            }
        }
        m
    }

    pub(super) fn slurm(&mut self, raw: &RawSlurm) -> crate::slurm::Settings {
        use crate::slurm::{Runtime, Settings};
        let mut s = Settings::default();
        let name = |v: &S<String>| {
            v.as_ref()
                .map(|v| v.get_ref().trim().to_string())
                .filter(|v| !v.is_empty())
        };
        s.partition = name(&raw.partition);
        s.account = name(&raw.account);
        s.qos = name(&raw.qos);
        for (key, v) in [
            ("partition", &raw.partition),
            ("account", &raw.account),
            ("qos", &raw.qos),
        ] {
            if let Some(v) = v.as_ref().filter(|v| {
                v.get_ref()
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control() || c == ',')
            }) {
                self.fail(
                    v.span(),
                    format!("slurm `{key}` = {:?} is not a Slurm name", v.get_ref()),
                    "write the name as `sinfo`/`sacctmgr` show it, without spaces",
                );
            }
        }
        if let Some(d) = self.duration("poll", &raw.poll, Duration::from_secs(300)) {
            s.poll = d;
        }
        for (key, v, out) in [
            ("log_dir", &raw.log_dir, &mut s.log_dir),
            ("jobcomp_log", &raw.jobcomp_log, &mut s.jobcomp_log),
            ("node_samples", &raw.node_samples, &mut s.node_samples),
        ] {
            if let Some(v) = v {
                let p = PathBuf::from(v.get_ref());
                if p.is_absolute() {
                    *out = Some(p);
                } else {
                    self.fail(
                        v.span(),
                        format!("slurm `{key}` = {:?} is not an absolute path", v.get_ref()),
                        "write e.g. \"/shared/gantry-logs\"",
                    );
                }
            }
        }
        if let Some(r) = &raw.runtime {
            match r.get_ref().as_str() {
                "docker" => s.runtime = Runtime::Docker,
                "apptainer" => s.runtime = Runtime::Apptainer,
                other => self.fail(
                    r.span(),
                    format!("slurm `runtime` = {other:?} is not a choice"),
                    "write \"docker\" or \"apptainer\"",
                ),
            }
        }
        if let Some(m) = &raw.shard_memory {
            match crate::units::parse_bytes(m.get_ref()) {
                Some(b) if b >= 1 << 20 => s.shard_memory = Some(b),
                _ => self.fail(
                    m.span(),
                    format!("slurm `shard_memory` = {:?} is not a size", m.get_ref()),
                    "write the GPU memory one Slurm shard stands for, e.g. \"10GiB\"",
                ),
            }
        }
        if let Some(n) = self.count("max_nice", &raw.max_nice, 2_000_000) {
            s.max_nice = n as u32;
        }
        s
    }

    pub(super) fn containers(&mut self, raw: &RawContainers) -> crate::resources::Containers {
        use crate::resources::Amount;
        let mut c = crate::resources::Containers::default();
        let sizes = "write a size such as \"8GiB\"";
        if let Some(v) = &raw.shm_size {
            match (v.get_ref().as_str(), crate::units::parse_bytes(v.get_ref())) {
                ("auto", _) => {}
                (_, Some(b)) if b >= 1 << 20 => c.shm_size = Some(b),
                (s, _) => self.fail(
                    v.span(),
                    format!("`shm_size` = {s:?} is not \"auto\" or a size of at least 1 MiB"),
                    format!("{sizes}, or \"auto\" (half the job's memory limit)"),
                ),
            }
        }
        for (key, v, out) in [
            ("memlock", &raw.memlock, &mut c.memlock),
            ("stack", &raw.stack, &mut c.stack),
        ] {
            if let Some(v) = v {
                match crate::units::parse_limit(v.get_ref()) {
                    Some(n) => *out = n,
                    None => self.fail(
                        v.span(),
                        format!("`{key}` = {:?} is not \"unlimited\" or a size", v.get_ref()),
                        "write e.g. \"unlimited\" or \"64MiB\"",
                    ),
                }
            }
        }
        if let Some(b) = &raw.allow_ipc_host {
            c.allow_ipc_host = *b.get_ref();
        }
        if let Some(b) = &raw.host_image {
            c.host_image = *b.get_ref();
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
                Some(n) if n.is_finite() && (if none_ok { 0.01 } else { 0.0 }..=1024.0).contains(&n) => {
                    Some(Amount::Is((n * 1000.0).round() as u64))
                }
                _ => {
                    self.fail(
                        v.span(),
                        format!(
                            "`{key}` = {} is not a number of CPUs from {} to 1024",
                            v.get_ref(),
                            if none_ok { "0.01" } else { "0" }
                        ),
                        if none_ok { cpus_hint } else { "write e.g. 1" },
                    );
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
                    self.fail(
                        v.span(),
                        format!(
                            "`{key}` = {s:?} is not a size{}",
                            if none_ok {
                                " of at least 6 MiB, \"auto\" or \"none\""
                            } else {
                                ""
                            }
                        ),
                        "write e.g. \"64GiB\"",
                    );
                    None
                }
            }
        };
        c.memory_per_gpu = memory("memory_per_gpu", &raw.memory_per_gpu, true).unwrap_or(c.memory_per_gpu);
        c.cpu_only_memory = memory("cpu_only_memory", &raw.cpu_only_memory, true).unwrap_or(c.cpu_only_memory);
        if let Some(Amount::Is(b)) = memory("reserve_memory", &raw.reserve_memory, false) {
            c.reserve_memory = b;
        }
        if let Some(v) = &raw.pids_limit {
            let (lo, hi) = (
                crate::spec::PIDS_LIMIT_RANGE.start(),
                crate::spec::PIDS_LIMIT_RANGE.end(),
            );
            match *v.get_ref() {
                n if crate::spec::PIDS_LIMIT_RANGE.contains(&n) => c.pids_limit = n,
                n => self.fail(
                    v.span(),
                    format!("`pids_limit` = {n} is not a number of processes from {lo} to {hi}"),
                    "write e.g. 4096 (processes and threads per job; a spec may ask for fewer)",
                ),
            }
        }
        c
    }

    pub(super) fn gpus(&mut self, v: &Spanned<toml::Value>) -> Option<GpuChoice> {
        let hint = "write gpus = \"all\", or a list of GPU indexes or UUIDs, e.g. [0, 1, 2, 3, 4, 5, 6]";
        let (line, column) = crate::units::line_col(self.text, v.span().start);
        let list = match v.get_ref() {
            toml::Value::String(s) if s == "all" => return None,
            toml::Value::Array(a) if !a.is_empty() => a,
            other => {
                self.fail(
                    v.span(),
                    format!("`gpus` = {other} is not \"all\" or a list of GPUs"),
                    hint,
                );
                return None;
            }
        };
        let mut gpus = vec![];
        for item in list {
            let g = match item {
                toml::Value::Integer(i) if (0..=1024).contains(i) => GpuRef::Index(*i as u32),
                toml::Value::String(s) if s.starts_with("GPU-") || s.starts_with("MIG-") => GpuRef::Uuid(s.clone()),
                other => {
                    self.fail(
                        v.span(),
                        format!("`gpus` lists {other}, which is neither a GPU index nor a GPU UUID"),
                        hint,
                    );
                    return None;
                }
            };
            if gpus.contains(&g) {
                self.fail(v.span(), format!("`gpus` lists GPU {g} twice"), "list each GPU once");
                return None;
            }
            gpus.push(g);
        }
        Some(GpuChoice {
            gpus,
            file: self.file.to_path_buf(),
            line,
            column,
        })
    }
}
