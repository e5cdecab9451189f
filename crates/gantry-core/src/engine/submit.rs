//! The one submission pipeline: the API (CLI and app), the drop folder, templates and "Run again" all
//! queue a job through [`Engine::submit`], so each check and each message exists once.
//!
//! Steps, in order: parse the spec (by file name) → validate → check the submitter's mounts as the
//! submitter → "can this machine ever run it" → the lab's limits (priority range, GPUs per user,
//! timeouts, container settings) → `after:` names to ids → the per-user queue bound → insert (a
//! `matrix` expands into one row per combination) → wake the loop.
//!
//! A submit with an idempotency key that its sender already used (within a day) is not queued
//! again: it is answered with the first one's jobs, before any check and once more under the store
//! lock right before the insert (two copies in flight at once queue one).

use std::path::PathBuf;

use tracing::info;

use super::{Engine, EngineError};
use crate::policy::Policy;
use crate::spec::{self, Format, JobSpec, Origin, SpecError, ValidJob};
use crate::store::{JobState, Owner, Store, SubmitKey};

/// What is being submitted.
pub enum Spec<'a> {
    /// A spec file's text; its name picks the format and the default job name, `base_dir` resolves
    /// relative mounts.
    File {
        text: &'a str,
        file_name: &'a str,
        base_dir: Option<PathBuf>,
        /// `gantry submit --begin`: in place of the spec's `begin`.
        begin: Option<&'a str>,
    },
    /// A config file dropped into a template folder: the template's job, with the config mounted from
    /// `accepted_dir/<first job id>-<file_name>` (where the drop folder moves it once queued).
    Template {
        template: &'a JobSpec,
        folder: &'a str,
        file_name: &'a str,
        base_dir: PathBuf,
        accepted_dir: PathBuf,
    },
    /// A previous job's spec again ("Run again", `gantry rerun`). Only its owner or an admin may; it
    /// runs as its owner, with the mounts checked as them.
    Rerun(i64),
}

/// A submission: what, by whom, and where it came from.
pub struct Submission<'a> {
    pub spec: Spec<'a>,
    pub owner: &'a Owner,
    /// Shown in history (`api:NAME`, `inbox:PATH`, `rerun:ID`).
    pub source: String,
    /// The drop folder's identity of the file (dev, inode, size, mtime): a file queued just before a
    /// crash is not queued again.
    pub source_key: Option<String>,
    /// The client's idempotency key (`SubmitRequest::idempotency_key`, spec files only): sent again
    /// by the same uid, the first submit's jobs are the answer. Another uid's same key is another key.
    pub idempotency_key: Option<&'a str>,
}

/// Idempotency keys clients may send: long enough not to collide by chance, short enough that
/// 10,000 of them per user stay small.
const KEY_LEN: std::ops::RangeInclusive<usize> = 8..=128;

fn check_key(key: &str) -> Result<(), EngineError> {
    let ok = KEY_LEN.contains(&key.len()) && key.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    if ok {
        return Ok(());
    }
    Err(EngineError::Refused(format!(
        "the idempotency key is not one Gantry accepts: use {} to {} letters, digits, '-', '_', '.' or ':' (the CLI and the app make one for you)",
        KEY_LEN.start(),
        KEY_LEN.end()
    )))
}

/// What a spec-file submit was (its name, folder and text), for telling a resend from another
/// submit under the same key: FNV-1a, 64 bits (stable across builds; the key is the sender's own,
/// so a collision can only confuse the sender).
fn fingerprint(text: &str, file_name: &str, base_dir: Option<&std::path::Path>) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let dir = base_dir.map(|d| d.as_os_str().as_encoded_bytes()).unwrap_or(b"");
    for part in [file_name.as_bytes(), &b"\0"[..], dir, &b"\0"[..], text.as_bytes()] {
        for b in part {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// `Some(jobs)` when `key` was already used: the first submit's jobs if it was this same submit,
/// else a refusal (a key is for one submission).
fn replay(st: &Store, key: &SubmitKey) -> Result<Option<Vec<i64>>, EngineError> {
    let Some(first) = st.keyed_submit(key.uid, &key.key)? else {
        return Ok(None);
    };
    if first.fingerprint != key.fingerprint {
        let ids = first
            .job_ids
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        return Err(EngineError::Refused(format!(
            "this idempotency key was already used for another submission (job {ids}); a new submission needs a new key"
        )));
    }
    info!(
        uid = key.uid,
        "a submit sent again with its key: answered with job {:?} again, nothing queued", first.job_ids
    );
    Ok(Some(first.job_ids))
}

/// `--begin` in place of the spec's `begin` (its form checked; the moment is fixed when queued).
pub(super) fn with_begin(mut job: ValidJob, begin: Option<&str>) -> Result<ValidJob, SpecError> {
    if let Some(b) = begin {
        crate::units::parse_when(b, 0, 0, "--begin")
            .map_err(|m| SpecError::new(m, "or leave --begin out to start as soon as GPUs are free"))?;
        job.spec.begin = Some(b.to_string());
    }
    Ok(job)
}

/// The format of a spec file, from its name.
pub fn format_of(file_name: &str) -> Result<Format, SpecError> {
    Format::from_name(file_name).ok_or_else(|| {
        SpecError::new(
            format!("{file_name:?} is not a job file: Gantry reads .yaml, .yml and .toml"),
            "rename it to .yaml or .toml if it is a job spec, or drop it into a template folder",
        )
    })
}

impl Engine {
    /// Queue a job (a `matrix` expands into one job per combination). Returns the new job ids.
    pub fn submit(&self, s: Submission<'_>) -> Result<Vec<i64>, EngineError> {
        match s.spec {
            Spec::File {
                text,
                file_name,
                base_dir,
                begin,
            } => {
                let key = match s.idempotency_key {
                    Some(k) => {
                        check_key(k)?;
                        Some(SubmitKey {
                            uid: s.owner.uid,
                            key: k.to_string(),
                            fingerprint: fingerprint(
                                &format!("{text}\0{}", begin.unwrap_or("")),
                                file_name,
                                base_dir.as_deref(),
                            ),
                        })
                    }
                    None => None,
                };
                // A resend: answered before any check (the first try's jobs may fill the queue cap now).
                if let Some(ids) = key.as_ref().map(|k| replay(&self.store(), k)).transpose()?.flatten() {
                    return Ok(ids);
                }
                let job = spec::validate_text(
                    text,
                    format_of(file_name)?,
                    &Origin {
                        file_name: Some(file_name.into()),
                        base_dir,
                    },
                )?;
                let job = with_begin(job, begin)?;
                self.check_mounts(&job, s.owner, None)?;
                self.queue_job(
                    &job,
                    s.owner,
                    &s.source,
                    s.source_key.as_deref(),
                    key.as_ref(),
                    |_, _| None,
                )
            }
            Spec::Template {
                template,
                folder,
                file_name,
                base_dir,
                accepted_dir,
            } => {
                let origin = Origin {
                    file_name: Some(file_name.into()),
                    base_dir: Some(base_dir),
                };
                // The config is mounted from where it will lie once accepted: `accepted/<first job id>-<name>`.
                let placeholder = accepted_dir
                    .join(format!("0-{file_name}"))
                    .to_string_lossy()
                    .into_owned();
                let instance = spec::instantiate_template(template, folder, &placeholder, file_name);
                let mut job = spec::validate(instance.spec, &origin).map_err(|(e, _)| e)?;
                job.mounts.push(instance.config);
                // The config file is checked by the drop folder (it is the dropper's own file).
                self.check_mounts(&job, s.owner, Some(&placeholder))?;
                let first = std::cell::Cell::new(None::<i64>);
                self.queue_job(&job, s.owner, &s.source, s.source_key.as_deref(), None, |id, job| {
                    let first = match first.get() {
                        Some(f) => f,
                        None => {
                            first.set(Some(id));
                            id
                        }
                    };
                    let real = accepted_dir
                        .join(format!("{first}-{file_name}"))
                        .to_string_lossy()
                        .into_owned();
                    let mut j = job.clone();
                    for m in j.mounts.iter_mut().filter(|m| m.host == placeholder) {
                        m.host = real.clone();
                    }
                    Some(j)
                })
            }
            Spec::Rerun(id) => {
                let old = self.owned(id, s.owner.uid)?;
                // An admin's rerun is the owner's job again: it runs as them, with their mounts checked as them.
                let owner = if s.owner.uid != old.owner_uid {
                    Owner {
                        uid: old.owner_uid,
                        gid: old.owner_gid,
                        name: old.owner.clone(),
                    }
                } else {
                    s.owner.clone()
                };
                self.check_mounts(&old.job, &owner, None)?;
                // Run again now: an old `begin` ("22:00", "+2h") meant the first run's time.
                let mut job = old.job.clone();
                job.spec.begin = None;
                job.begin_ms = None;
                self.queue_job(&job, &owner, &s.source, s.source_key.as_deref(), None, |_, _| None)
            }
        }
    }

    /// Everything a submission of this file checks that does not depend on who submits it, without
    /// queueing (the app's preview).
    pub fn validate_file(
        &self,
        text: &str,
        file_name: &str,
        base_dir: Option<PathBuf>,
    ) -> Result<ValidJob, EngineError> {
        let job = spec::validate_text(
            text,
            format_of(file_name)?,
            &Origin {
                file_name: Some(file_name.into()),
                base_dir,
            },
        )?;
        self.check_fits(&job)?;
        Ok(job)
    }

    /// The steps after validation and the mount check. `finalize` may rewrite each job once its id is
    /// known (template mounts). `key`: recorded with the jobs, in their transactions.
    fn queue_job(
        &self,
        job: &ValidJob,
        owner: &Owner,
        source: &str,
        source_key: Option<&str>,
        key: Option<&SubmitKey>,
        finalize: impl Fn(i64, &ValidJob) -> Option<ValidJob>,
    ) -> Result<Vec<i64>, EngineError> {
        let policy = self.policy();
        let jobs = self.checked_jobs(job, owner, &policy)?;
        let mut st = self.store();
        // Under the lock: of two copies of one submit in flight at once, the second finds the first's key.
        if let Some(ids) = key.map(|k| replay(&st, k)).transpose()?.flatten() {
            return Ok(ids);
        }
        self.check_queued_cap(&st, jobs.len(), owner, &policy)?;
        // Mark the ids before they exist: a failed mark then refuses the submit, never answers "failed"
        // for jobs that were queued (a gap in ids is harmless).
        self.mark_job_id(st.job_id_high_water()? + jobs.len() as i64)?;
        let mut ids = vec![];
        for (i, j) in jobs.iter().enumerate() {
            let id = st.insert_job_keyed(
                j,
                owner,
                source,
                if i == 0 { source_key } else { None },
                key.map(|k| (k, ids.as_slice())),
                &finalize,
            )?;
            info!(job = id, owner = %owner.name, "queued {}", j.name);
            ids.push(id);
        }
        drop(st);
        for id in &ids {
            self.notify_job(*id, JobState::Queued);
        }
        self.wake.notify_one();
        Ok(ids)
    }

    /// Every check a job passes before it is inserted, after its mounts: can it ever fit, the lab's
    /// limits, `begin` fixed as a moment, `after` names to ids; a `matrix` expanded. What
    /// [`Engine::queue_job`] inserts and what a dry run ([`Engine::preview`]) shows.
    pub(super) fn checked_jobs(
        &self,
        job: &ValidJob,
        owner: &Owner,
        policy: &Policy,
    ) -> Result<Vec<ValidJob>, EngineError> {
        self.check_fits(job)?;
        let job = self.apply_limits(job, owner, policy)?;
        let job = self.resolve_begin(job, policy)?;
        let job = self.resolve_after(&job, owner)?;
        Ok(spec::expand(&job))
    }

    /// The per-user bound on queued jobs (admins have none), for `adding` more.
    pub(super) fn check_queued_cap(
        &self,
        st: &Store,
        adding: usize,
        owner: &Owner,
        policy: &Policy,
    ) -> Result<(), EngineError> {
        if policy.is_admin(owner.uid) {
            return Ok(());
        }
        let queued = st.queued_count(owner.uid)?;
        if queued + adding > policy.max_queued_per_user {
            return Err(EngineError::Refused(format!(
                "you have {queued} jobs queued; adding {adding} would pass the limit of {} queued jobs per user{}. \
                 Wait for some to start, or cancel ones you no longer need (`gantry ls`, `gantry cancel ID`)",
                policy.max_queued_per_user,
                self.set_in("limits.max_queued_jobs"),
            )));
        }
        Ok(())
    }

    /// `begin` as a moment, from now (the engine's clock, the workstation's time zone): in the past
    /// (a date, `today 09:00`) it is refused; more than the lab's `max_begin` ahead too.
    fn resolve_begin(&self, mut job: ValidJob, policy: &Policy) -> Result<ValidJob, EngineError> {
        use crate::units::{duration_setting, local_datetime, parse_when};
        let Some(b) = job.spec.begin.clone() else {
            job.begin_ms = None;
            return Ok(job);
        };
        let now = self.now();
        let hint = "write e.g. `begin: \"22:00\"`, `begin: \"tomorrow 08:00\"` or `begin: \"+2h\"`, or leave it out";
        let (at, _) = parse_when(&b, now, 0, "`begin`").map_err(|m| SpecError::new(m, hint))?;
        // A minute of slack: `+0m` or "now" written as this minute starts now.
        if at < now - 60_000 {
            return Err(SpecError::new(
                format!("`begin` {b:?} is in the past ({})", local_datetime(at)),
                "give a later time, or leave `begin` out to start as soon as GPUs are free",
            )
            .into());
        }
        let max = policy.max_begin.as_millis() as i64;
        if at - now > max {
            return Err(SpecError::new(
                format!(
                    "`begin` {b:?} ({}) is more than {} ahead{}",
                    local_datetime(at),
                    duration_setting(policy.max_begin),
                    self.set_in("limits.max_begin")
                ),
                format!(
                    "give a time within {}, or book GPUs for later (`gantry book`)",
                    duration_setting(policy.max_begin)
                ),
            )
            .into());
        }
        job.begin_ms = (at > now).then_some(at);
        Ok(job)
    }

    /// The lab's limits on a job about to be queued: the priority range (wider for admins), the GPUs
    /// one user may hold, and the timeouts (a job without one gets `default_timeout`).
    fn apply_limits(&self, job: &ValidJob, owner: &Owner, policy: &Policy) -> Result<ValidJob, EngineError> {
        let (lo, hi) = policy.priority_range(owner.uid);
        if !(lo..=hi).contains(&job.spec.priority) {
            return Err(SpecError::new(
                format!(
                    "priority {} is outside the range you may use ({lo}..{hi}){}",
                    job.spec.priority,
                    self.set_in(if policy.is_admin(owner.uid) {
                        "limits.admin_priority"
                    } else {
                        "limits.priority"
                    })
                ),
                format!("use a priority from {lo} to {hi}; ask an admin to run something sooner"),
            )
            .into());
        }
        if let Some(cap) = policy.max_running_gpus.filter(|c| job.gpus > *c) {
            return Err(SpecError::new(
                format!(
                    "the job asks for {} GPUs; the lab limit is {cap} GPUs per user{}",
                    job.gpus,
                    self.set_in("limits.max_running_gpus")
                ),
                format!("ask for at most {cap} GPUs"),
            )
            .into());
        }
        policy.containers.check(job, &|k| self.set_in(k))?;
        policy.containers.check_pids(job, &|k| self.set_in(k))?;
        // `image: host` is pulled from nowhere: the lab turns it on or off with `[containers] host_image`.
        if !job.spec.is_host_image() {
            policy.images.check(&job.spec.image, &|k| self.set_in(k))?;
        }
        let mut job = job.clone();
        if job.spec.interactive {
            return self.session_limits(job, owner, policy);
        }
        if job.timeout.is_none() {
            job.timeout = policy.default_timeout;
        }
        if let (Some(t), Some(max)) = (job.timeout, policy.max_timeout) {
            if t > max {
                use crate::units::duration_setting as setting;
                return Err(SpecError::new(
                    format!(
                        "`timeout` {} is longer than the lab's limit of {}{}",
                        setting(t),
                        setting(max),
                        self.set_in("limits.max_timeout")
                    ),
                    format!("use a `timeout` of at most {}", setting(max)),
                )
                .into());
            }
        }
        Ok(job)
    }

    /// `[sessions]` on an interactive session: its length (`timeout`, `--for`) is the lab's default
    /// when unset and at most `max_length`; the owner's sessions together ask for at most `max_gpus`.
    fn session_limits(&self, mut job: ValidJob, owner: &Owner, policy: &Policy) -> Result<ValidJob, EngineError> {
        use crate::units::duration_setting as setting;
        let s = &policy.sessions;
        let length = *job.timeout.get_or_insert(s.default_length);
        if length > s.max_length {
            return Err(SpecError::new(
                format!(
                    "the session would last {}; the lab allows sessions of at most {}{}",
                    setting(length),
                    setting(s.max_length),
                    self.set_in("sessions.max_length")
                ),
                format!(
                    "ask for at most {} (`gantry shell --for {}`)",
                    setting(s.max_length),
                    setting(s.max_length)
                ),
            )
            .into());
        }
        if let Some(cap) = s.max_gpus.filter(|_| !policy.is_admin(owner.uid)) {
            let open = self.store().open_session_gpus(owner.uid)?;
            if open + job.gpus > cap {
                return Err(EngineError::Refused(format!(
                    "your sessions already ask for {open} GPU{}; this one's {} would pass the lab's limit of {cap} GPUs in sessions per user{}. \
                     End one (`gantry ls`, then `gantry cancel ID`, or exit its shell), or ask for fewer GPUs",
                    if open == 1 { "" } else { "s" },
                    job.gpus,
                    self.set_in("sessions.max_gpus"),
                )));
            }
        }
        Ok(job)
    }

    /// Turn `after: [name]` into job ids (the owner's latest job of that name); check ids exist.
    fn resolve_after(&self, job: &ValidJob, owner: &Owner) -> Result<ValidJob, EngineError> {
        let mut job = job.clone();
        let st = self.store();
        for a in job.spec.after.iter_mut() {
            match a {
                spec::IdOrName::Id(id) => {
                    if st.state_of(*id)?.is_none() {
                        return Err(SpecError::new(
                            format!("`after` refers to job {id}, which does not exist"),
                            "check the id with `gantry ls` or `gantry history`",
                        )
                        .into());
                    }
                }
                spec::IdOrName::Name(n) => match st.latest_by_name(owner.uid, n)? {
                    Some(id) => *a = spec::IdOrName::Id(id),
                    None => {
                        return Err(SpecError::new(
                            format!("`after` refers to {n:?}, but you have no job with that name"),
                            "submit that job first, or use its id",
                        )
                        .into())
                    }
                },
            }
        }
        Ok(job)
    }
}
