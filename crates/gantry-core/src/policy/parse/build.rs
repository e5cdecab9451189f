//! `Check::build`: the whole file into a [`LabConfig`]: the top-level keys (`gpus`, `simulate`,
//! `backend`) and the small sections (`[access]`, `[limits]`, `[fair_share]`, `[jobs]`,
//! `[preemption]`, `[logs]`, `[history]`, `[images]`, `[disk]`, `[inbox]`); the larger sections
//! are read by their own files.

use super::*;

impl Check<'_> {
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
}
