//! The engine with `backend = "slurm"`: no local placement. Each queued job is submitted to Slurm as
//! its owner (one attempt = one Slurm job), a tracker reads `squeue --json` every `[slurm] poll`, and
//! one supervisor per attempt turns what Slurm says into Gantry's states, "why waiting", log copies
//! and the attempt's end (recorded through [`super::outcome`] like the Docker backend's).
//!
//! Submission is idempotent: the attempt row (the intent) is written before `sbatch`, the Slurm job
//! carries the attempt's marker in `--comment`, and its id is recorded after. After a restart an
//! attempt without an id is looked up by its marker before anything is submitted again.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::outcome::How;
use super::{append_log, Engine, EngineError, RunHandle};
use crate::access::{self, Cred};
use crate::config::STORE_RETRY;
use crate::scheduler::Waiting;
use crate::slurm::{self as sl, As, Node, Resume, Seen, Settings, Slurm, SqJob, Stop, Submission};
use crate::store::{now_ms, Attempt, Job, JobState, QueuedRow};

/// What the last `squeue --json` said about this engine's jobs.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    /// When the `squeue` that produced it began (ms): it shows every job submitted before.
    pub at: i64,
    pub ok: bool,
    pub jobs: HashMap<u64, SqJob>,
}

/// The Slurm backend's shared state.
pub(crate) struct SlurmRun {
    pub client: Slurm,
    pub settings: Settings,
    pub snapshot: watch::Sender<Arc<Snapshot>>,
    /// Read `squeue` now (after a submit), not at the next poll.
    pub refresh: Notify,
    pub nodes: RwLock<Vec<Node>>,
    pub jobcomp: RwLock<Option<PathBuf>>,
}

impl SlurmRun {
    pub fn new(settings: Settings) -> SlurmRun {
        let (snapshot, _) = watch::channel(Arc::new(Snapshot::default()));
        SlurmRun { client: Slurm, settings, snapshot, refresh: Notify::new(), nodes: RwLock::new(vec![]), jobcomp: RwLock::new(None) }
    }
}

/// Why submitting failed, and whether retrying can help.
enum SubmitError {
    Refused(String),
    Failed { message: String, transient: bool },
}

impl From<crate::spec::SpecError> for SubmitError {
    fn from(e: crate::spec::SpecError) -> Self {
        SubmitError::Refused(e.to_string())
    }
}
impl From<sl::Refusal> for SubmitError {
    fn from(e: sl::Refusal) -> Self {
        SubmitError::Refused(e.0)
    }
}
impl From<sl::SlurmError> for SubmitError {
    fn from(e: sl::SlurmError) -> Self {
        SubmitError::Failed { transient: e.is_transient(), message: e.to_string() }
    }
}

impl Engine {
    fn slurm(&self) -> &SlurmRun {
        self.slurm.as_ref().expect("the Slurm backend")
    }

    pub fn is_slurm(&self) -> bool {
        self.slurm.is_some()
    }

    /// The main loop of the Slurm backend (see [`Engine::run`]).
    pub(super) async fn run_slurm(self: Arc<Self>) -> Result<(), EngineError> {
        info!("backend: Slurm (partition {}), squeue every {:?}", self.slurm().settings.partition.as_deref().unwrap_or("default"), self.slurm().settings.poll);
        let tracker = tokio::spawn(self.clone().slurm_tracker());
        self.clone().recover_slurm()?;
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
            self.clone().submit_queued();
            tokio::time::sleep(crate::config::PASS_MIN_GAP).await;
        }
        sampler.abort();
        pruner.abort();
        tracker.abort();
        self.tasks.close();
        self.tasks.wait().await;
        info!("engine stopped; Slurm jobs keep running and are followed again on next start");
        Ok(())
    }

    /// Read `squeue --json` every poll (or when asked) and publish this engine's jobs.
    async fn slurm_tracker(self: Arc<Self>) {
        let s = self.slurm();
        let jobcomp = match s.settings.jobcomp_log.clone() {
            Some(p) => Some(p),
            None => s.client.jobcomp_log().await,
        };
        *s.jobcomp.write().unwrap() = jobcomp;
        let prefix = format!("gantry:{}:", self.db_uid);
        let mut n: u64 = 0;
        loop {
            let at = now_ms();
            match s.client.queue().await {
                Ok(jobs) => {
                    let jobs = jobs.into_iter().filter(|j| j.comment.as_deref().is_some_and(|c| c.starts_with(&prefix))).map(|j| (j.job_id, j)).collect();
                    s.snapshot.send_replace(Arc::new(Snapshot { at, ok: true, jobs }));
                    let mut h = self.health.write().unwrap();
                    if h.docker_problem.take().is_some() {
                        info!("Slurm answers again");
                    }
                }
                Err(e) => {
                    let msg = e.to_string();
                    let mut h = self.health.write().unwrap();
                    if h.docker_problem.as_deref() != Some(&msg) {
                        warn!("{msg}");
                    }
                    h.docker_problem = Some(msg);
                }
            }
            if n % 5 == 0 {
                match s.client.nodes().await {
                    Ok(nodes) => *s.nodes.write().unwrap() = nodes,
                    Err(e) => warn!("cannot list Slurm's nodes: {e}"),
                }
            }
            n += 1;
            tokio::select! {
                _ = tokio::time::sleep(s.settings.poll) => {}
                _ = s.refresh.notified() => {}
                _ = self.shutdown.cancelled() => return,
            }
        }
    }

    /// One pass: every queued job that may start is submitted (Slurm decides where and when).
    fn submit_queued(self: Arc<Self>) {
        if self.queue.lock().unwrap().is_stale() {
            if let Err(e) = self.store().track_queue() {
                error!("cannot read the queue: {e}");
                return;
            }
        }
        if self.health.read().unwrap().store_problem.is_some() {
            let probe = self.store().set_meta("write_probe", &now_ms().to_string());
            match probe {
                Ok(()) => self.store_ok(),
                Err(e) => self.store_failed("probing the database", &e),
            }
        }
        let queued: Vec<Arc<QueuedRow>> = self.queue.lock().unwrap().rows();
        let now = now_ms();
        let problem = self.health.read().unwrap().store_problem.clone();
        let mut blocked: Vec<(i64, String)> = vec![];
        let mut ready: Vec<(Arc<QueuedRow>, Vec<String>)> = vec![];
        for j in queued {
            if j.held {
                blocked.push((j.id, format!("held by its owner (`gantry release {}`)", j.id)));
            } else if let Some(nb) = j.not_before.filter(|nb| *nb > now) {
                blocked.push((j.id, format!("retrying in {}", super::human(nb - now))));
            } else if let Some(p) = &problem {
                blocked.push((j.id, p.clone()));
            } else {
                match self.slurm_after(&j) {
                    Ok(after) => ready.push((j, after)),
                    Err(why) => blocked.push((j.id, why)),
                }
            }
        }
        {
            let running = self.running.lock().unwrap();
            let mut w = self.waiting.write().unwrap();
            w.retain(|id, _| running.contains_key(id));
            for (i, (id, reason)) in blocked.into_iter().enumerate() {
                w.insert(id, Waiting { job_id: id, position: i + 1, reason, reserved: vec![] });
            }
        }
        let mut singles: Vec<(Job, Vec<String>)> = vec![];
        let mut groups: HashMap<String, Vec<(Job, Vec<String>)>> = HashMap::new();
        for (row, after) in ready {
            let job = match self.store().job(row.id) {
                Ok(Some(j)) => j,
                Ok(None) => continue,
                Err(e) => {
                    error!("cannot read job {}: {e}", row.id);
                    return;
                }
            };
            match job.job.matrix_part.clone() {
                Some(p) if job.attempts == 0 && p.count >= 2 => groups.entry(p.group).or_default().push((job, after)),
                _ => singles.push((job, after)),
            }
        }
        // A `matrix` whose jobs are all ready together (same dependencies, first attempts) goes to
        // Slurm as one job array; otherwise (one was held, cancelled or is retrying) one by one.
        for (_, mut g) in groups {
            let count = g[0].0.job.matrix_part.as_ref().map(|p| p.count as usize).unwrap_or(0);
            if g.len() == count && g.iter().all(|(_, a)| *a == g[0].1) {
                g.sort_by_key(|(j, _)| j.job.matrix_part.as_ref().map(|p| p.index));
                if !self.clone().start_array(g) {
                    return;
                }
            } else if g.iter().all(|(j, _)| now - j.submitted_at < 3_000) {
                continue; // its siblings may still be arriving: next pass
            } else {
                singles.extend(g);
            }
        }
        for (job, after) in singles {
            let Some(attempt) = self.begin_slurm_attempt(&job, "submitting to Slurm") else { return };
            let Some((attempt, cancel)) = attempt else { continue };
            self.supervise(job.id, self.clone().submit_and_follow(job, attempt, after, cancel));
        }
    }

    /// queued -> starting with a new attempt and its handle. `None`: the database failed (stop the
    /// pass); `Some(None)`: the job is no longer queued.
    fn begin_slurm_attempt(&self, job: &Job, note: &str) -> Option<Option<(Attempt, CancellationToken)>> {
        let begun = self.store().begin_attempt_noted(job.id, &[], &[], Some(note));
        match begun {
            Ok(Some(a)) => {
                let cancel = CancellationToken::new();
                self.running.lock().unwrap().insert(job.id, handle(job, cancel.clone()));
                self.notify_job(job.id, JobState::Starting);
                Some(Some((a, cancel)))
            }
            Ok(None) => Some(None),
            Err(e) => {
                self.store_failed(&format!("starting job {}", job.id), &e);
                None
            }
        }
    }

    /// Begin the attempts of a matrix's jobs and submit them as one array. False when the database failed.
    fn start_array(self: Arc<Self>, g: Vec<(Job, Vec<String>)>) -> bool {
        let after = g[0].1.clone();
        let mut parts = vec![];
        for (job, _) in g {
            match self.begin_slurm_attempt(&job, "submitting to Slurm with its matrix as one job array") {
                None => return false,
                Some(None) => {}
                Some(Some((a, cancel))) => parts.push((job, a, cancel)),
            }
        }
        if parts.len() == 1 {
            let (job, attempt, cancel) = parts.pop().unwrap();
            self.supervise(job.id, self.clone().submit_and_follow(job, attempt, after, cancel));
        } else if let Some(first) = parts.first().map(|p| p.0.id) {
            self.supervise(first, self.clone().submit_array_and_follow(parts, after));
        }
        true
    }

    async fn submit_array_and_follow(self: Arc<Self>, parts: Vec<(Job, Attempt, CancellationToken)>, after: Vec<String>) {
        for (job, attempt, _) in &parts {
            append_log(&self.log_of(job.id), &format!("attempt {} of job {}: submitting to Slurm with its matrix as one job array", attempt.n, job.id));
        }
        let submitted = self.submit_array(&parts, after).await;
        let master = match submitted {
            Ok(m) => m,
            Err(e) => {
                let how = how_of(e);
                for (job, attempt, _) in &parts {
                    if let How::Refused(m) | How::StartFailed { message: m, .. } = &how {
                        append_log(&self.log_of(job.id), &format!("not submitted: {m}"));
                    }
                    self.end_attempt(job.id, attempt, &how, None).await;
                }
                return;
            }
        };
        let since = now_ms();
        info!(slurm = master, "submitted {} jobs to Slurm as one job array", parts.len());
        for (job, attempt, _) in &parts {
            let task = job.job.matrix_part.as_ref().map(|p| p.index);
            if !self.record_slurm_id(job.id, attempt, master, task).await {
                return;
            }
            append_log(&self.log_of(job.id), &format!("submitted as Slurm job {}", target(master, task)));
        }
        self.slurm().refresh.notify_one();
        for (job, attempt, cancel) in parts {
            let task = job.job.matrix_part.as_ref().map(|p| p.index);
            let e = self.clone();
            self.supervise(job.id, e.follow_slurm(job, attempt, master, task, since, cancel));
        }
    }

    /// Checks each job as its owner, then one `sbatch --array` whose script runs each task's job.
    async fn submit_array(&self, parts: &[(Job, Attempt, CancellationToken)], after: Vec<String>) -> Result<u64, SubmitError> {
        let s = self.slurm();
        let policy = self.policy();
        let first = &parts[0].0;
        let group = first.job.matrix_part.as_ref().map(|p| p.group.clone()).unwrap_or_default();
        let home = Self::home_of(first.owner_uid).map(PathBuf::from).ok_or_else(|| SubmitError::Refused(format!("user {} has no home folder to run the job from", first.owner)))?;
        let pattern = format!("{}-arr{group}-%a.out", self.db_uid);
        let output = match &s.settings.log_dir {
            Some(d) => sl::user_log_dir(d, first.owner_uid, first.owner_gid)?.join(&pattern),
            None => home.join(&pattern),
        };
        let marker = sl::array_marker(&self.db_uid, &group);
        let mut subs = vec![];
        for (job, _, _) in parts {
            policy.containers.check(&job.job, &|k| self.set_in(k))?;
            let cred = Cred::of_user(job.owner_uid, job.owner_gid);
            let checked = access::check_mounts_async(cred, job.job.mounts.clone(), job.job.spec.workdir.clone(), self.forbidden()).await?;
            let sub = Submission {
                job: &job.job,
                marker: marker.clone(),
                uid: job.owner_uid,
                gid: job.owner_gid,
                home: home.clone(),
                output: output.clone(),
                priority_range: policy.user_priority,
                after: after.clone(),
                mounts: checked.into_iter().map(|c| c.mount).collect(),
            };
            subs.push((job.job.matrix_part.as_ref().map(|p| p.index).unwrap_or(0), sub, job.id));
        }
        let mut args = sl::sbatch_args(&subs[0].1, &s.settings)?;
        let base = first.name.split('[').next().unwrap_or(&first.name).to_string();
        for a in args.iter_mut().filter(|a| a.starts_with("--job-name=")) {
            *a = format!("--job-name={}", base.replace(char::is_whitespace, "_"));
        }
        args.push(sl::array_arg(&subs.iter().map(|p| p.0).collect::<Vec<_>>()));
        let script = sl::array_script(&subs, &marker, s.settings.runtime);
        Ok(s.client.submit(&As { name: first.owner.clone(), uid: first.owner_uid }, &args, &script).await?)
    }

    /// The Slurm ids a queued job runs after (`--dependency=afterok`), or why it must wait in Gantry
    /// first. A dependency that has ended without success fails the job, as with the local backend.
    fn slurm_after(&self, j: &QueuedRow) -> Result<Vec<String>, String> {
        let mut ids = vec![];
        for d in &j.after {
            let dep = self.reader().job(*d);
            match dep {
                Ok(Some(dep)) if dep.state == JobState::Succeeded => {}
                Ok(Some(dep)) if dep.state.is_final() => {
                    let msg = format!("dependency job {d} ended {}; this job will not run", dep.state.as_str());
                    match self.store().fail_queued(j.id, &msg) {
                        Ok(true) => self.notify_job(j.id, JobState::Failed),
                        Ok(false) => {}
                        Err(e) => self.store_failed(&format!("failing job {}", j.id), &e),
                    }
                    return Err(msg);
                }
                Ok(Some(dep)) => {
                    // In Slurm on its last attempt: Slurm holds this one until it succeeds. A dependency
                    // that may still be retried gets a new Slurm id, so this job waits in Gantry.
                    let open = self.reader().open_attempt(dep.id).ok().flatten();
                    match open.filter(|a| a.n > dep.retries).and_then(|a| a.slurm_job_id.map(|id| target(id, a.slurm_array_task))) {
                        Some(id) => ids.push(id),
                        None => return Err(format!("waiting for job {d} to succeed (it is {})", dep.state.as_str())),
                    }
                }
                Ok(None) => return Err(format!("dependency job {d} no longer exists")),
                Err(e) => return Err(format!("cannot read dependency job {d}: {e}")),
            }
        }
        Ok(ids)
    }

    /// Check the job as its owner, submit it to Slurm as them, record the Slurm id, then follow it.
    async fn submit_and_follow(self: Arc<Self>, job: Job, attempt: Attempt, after: Vec<String>, cancel: CancellationToken) {
        let log = self.log_of(job.id);
        append_log(&log, &format!("attempt {} of job {}: submitting to Slurm", attempt.n, job.id));
        let submitted = self.submit_one(&job, &attempt, after, &cancel).await;
        let id = match submitted {
            Ok(Some(id)) => id,
            Ok(None) => return self.end_attempt(job.id, &attempt, &How::CancelledBeforeStart, None).await,
            Err(e) => {
                let how = how_of(e);
                if let How::Refused(m) | How::StartFailed { message: m, .. } = &how {
                    append_log(&log, &format!("not submitted: {m}"));
                    warn!(job = job.id, "not submitted to Slurm: {m}");
                }
                return self.end_attempt(job.id, &attempt, &how, None).await;
            }
        };
        let since = now_ms();
        if !self.record_slurm_id(job.id, &attempt, id, None).await {
            return;
        }
        append_log(&log, &format!("submitted as Slurm job {id}"));
        info!(job = job.id, slurm = id, "submitted to Slurm");
        self.slurm().refresh.notify_one();
        self.follow_slurm(job, attempt, id, None, since, cancel).await;
    }

    async fn submit_one(&self, job: &Job, attempt: &Attempt, after: Vec<String>, cancel: &CancellationToken) -> Result<Option<u64>, SubmitError> {
        let s = self.slurm();
        let policy = self.policy();
        policy.containers.check(&job.job, &|k| self.set_in(k))?;
        let home = Self::home_of(job.owner_uid).map(PathBuf::from).ok_or_else(|| SubmitError::Refused(format!("user {} has no home folder to run the job from", job.owner)))?;
        // The same mount checks as the local backend, as the owner, right before submitting.
        let cred = Cred::of_user(job.owner_uid, job.owner_gid);
        let checked = access::check_mounts_async(cred, job.job.mounts.clone(), job.job.spec.workdir.clone(), self.forbidden()).await?;
        let mounts = checked.into_iter().map(|c| c.mount).collect();
        let file = self.slurm_output_name(job.id, attempt.n);
        let output = match &s.settings.log_dir {
            Some(d) => sl::user_log_dir(d, job.owner_uid, job.owner_gid)?.join(&file),
            None => {
                let p = home.join(&file);
                append_log(&self.log_of(job.id), &format!("no shared log folder is configured ([slurm] log_dir): Slurm writes this job's output on its node to {}", p.display()));
                p
            }
        };
        let sub = Submission {
            job: &job.job,
            marker: sl::marker(&self.db_uid, job.id, attempt.n),
            uid: job.owner_uid,
            gid: job.owner_gid,
            home,
            output,
            priority_range: policy.user_priority,
            after,
            mounts,
        };
        let args = sl::sbatch_args(&sub, &s.settings)?;
        let script = sl::batch_script(&sub, job.id, attempt.n, s.settings.runtime);
        let cancel_requested = self.store().job(job.id).ok().flatten().is_some_and(|j| j.cancel_requested);
        if cancel.is_cancelled() || cancel_requested {
            return Ok(None);
        }
        Ok(Some(s.client.submit(&As { name: job.owner.clone(), uid: job.owner_uid }, &args, &script).await?))
    }

    fn slurm_output_name(&self, job_id: i64, attempt_n: u32) -> String {
        format!("{}-{job_id}-a{attempt_n}.out", self.db_uid)
    }

    /// Record the Slurm id, retrying until the write succeeds (nothing new starts meanwhile). False on
    /// shutdown first: the next start finds the job by its marker.
    async fn record_slurm_id(&self, job_id: i64, attempt: &Attempt, id: u64, task: Option<u32>) -> bool {
        loop {
            let written = self.store().set_slurm_job_id(attempt.id, id, task);
            match written {
                Ok(()) => {
                    self.store_ok();
                    if let Some(h) = self.running.lock().unwrap().get_mut(&job_id) {
                        h.container_id = Some(format!("slurm:{}", target(id, task)));
                    }
                    return true;
                }
                Err(e) => {
                    self.store_failed(&format!("recording the Slurm id of job {job_id}"), &e);
                    tokio::select! {
                        _ = tokio::time::sleep(STORE_RETRY) => {}
                        _ = self.shutdown.cancelled() => return false,
                    }
                }
            }
        }
    }

    /// Follow Slurm job `id` to its end: "why waiting", running, output, Gantry's own timeout, cancel
    /// (scancel as the owner), then record how it ended, once. `since`: only snapshots taken after
    /// this (ms) are sure to show the job.
    async fn follow_slurm(self: Arc<Self>, job: Job, attempt: Attempt, id: u64, task: Option<u32>, since: i64, cancel: CancellationToken) {
        let s = self.slurm();
        let mut rx = s.snapshot.subscribe();
        let who = As { name: job.owner.clone(), uid: job.owner_uid };
        let mut stop: Option<Stop> = None;
        let mut running_since: Option<i64> = None;
        let mut missing = 0u32;
        let mut copied = self.slurm_copied(job.id);
        let file = match (task, &job.job.matrix_part) {
            (Some(t), Some(p)) => format!("{}-arr{}-{t}.out", self.db_uid, p.group),
            _ => self.slurm_output_name(job.id, attempt.n),
        };
        let shown = target(id, task);
        loop {
            let snap = rx.borrow_and_update().clone();
            if snap.ok && snap.at >= since {
                // Why Gantry stopped it, also when that was before an engine restart.
                let stop = stop.or_else(|| {
                    let timed_out = running_since.zip(job.timeout_ms).is_some_and(|(s, t)| now_ms() >= s + t);
                    timed_out.then_some(Stop::Timeout)
                });
                let seen = match sl::find_job(&snap.jobs, id, task) {
                    Some(j) => {
                        missing = 0;
                        let seen = sl::seen(&j.state(), &j.state_reason, j.exit(), running_since.is_some(), stop, job.timeout_ms);
                        // It ran, also when it started and ended between two polls: record when.
                        let ran = match &seen {
                            Seen::Running => true,
                            Seen::Ended(h) => j.started_at_s().is_some() && matches!(h, How::Exited { .. } | How::TimedOut { .. }),
                            Seen::Pending(_) => false,
                        };
                        if ran && running_since.is_none() {
                            running_since = Some(j.started_at_s().map(|t| t * 1000).unwrap_or_else(now_ms));
                            self.slurm_running(&job, &attempt, j, &shown, running_since.unwrap_or_else(now_ms));
                        }
                        Some(seen)
                    }
                    None => {
                        // Gone from squeue (it ended longer ago than MinJobAge): jobcomp has its end.
                        let done = self.jobcomp_record(id, task, job.owner_uid).await;
                        match done {
                            Some(c) => Some(sl::seen(&c.state, "", c.exit, running_since.is_some() || c.started, stop, job.timeout_ms)),
                            None => {
                                missing += 1;
                                (missing >= 3).then(|| Seen::Ended(How::Lost(format!("Slurm no longer knows job {shown}, and its end is not in the jobcomp log"))))
                            }
                        }
                    }
                };
                match seen {
                    Some(Seen::Pending(why)) => {
                        let mut w = self.waiting.write().unwrap();
                        w.insert(job.id, Waiting { job_id: job.id, position: 0, reason: format!("Slurm job {shown}: {why}"), reserved: vec![] });
                    }
                    Some(Seen::Ended(how)) => {
                        self.copy_slurm_output(&job, &file, &mut copied, true).await;
                        let how = sl::oom_from_output(how, &self.log_tail(job.id));
                        self.waiting.write().unwrap().remove(&job.id);
                        self.end_attempt(job.id, &attempt, &how, None).await;
                        return;
                    }
                    Some(Seen::Running) | None => {}
                }
            }
            if running_since.is_some() {
                self.copy_slurm_output(&job, &file, &mut copied, false).await;
            }
            let deadline = running_since.zip(job.timeout_ms).map(|(s, t)| s + t).filter(|_| stop.is_none());
            let until_deadline = async {
                match deadline {
                    Some(d) => tokio::time::sleep(std::time::Duration::from_millis((d - now_ms()).max(0) as u64)).await,
                    None => std::future::pending().await,
                }
            };
            let why = tokio::select! {
                r = rx.changed() => {
                    if r.is_err() {
                        return;
                    }
                    None
                }
                _ = cancel.cancelled(), if stop.is_none() => Some(Stop::Cancel),
                _ = until_deadline => Some(Stop::Timeout),
                _ = self.shutdown.cancelled() => return,
            };
            if let Some(why) = why {
                if why == Stop::Timeout {
                    append_log(&self.log_of(job.id), &format!("stopping: the {} timeout passed", super::human(job.timeout_ms.unwrap_or(0))));
                }
                match s.client.cancel(&who, &shown).await {
                    Ok(()) => stop = Some(why),
                    Err(e) => {
                        warn!(job = job.id, "scancel {shown} as {} failed: {e}; trying again", job.owner);
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    }
                }
                s.refresh.notify_one();
            }
        }
    }

    /// Slurm started the job: mark it running, with the node's GPUs it got.
    fn slurm_running(&self, job: &Job, attempt: &Attempt, j: &SqJob, id: &str, since: i64) {
        self.waiting.write().unwrap().remove(&job.id);
        let gpus = j.gpu_indexes();
        if let Some(h) = self.running.lock().unwrap().get_mut(&job.id) {
            h.gpus = gpus.clone();
        }
        // One store guard per statement: a second `self.store()` inside the first's expression would deadlock.
        let gpus_written = self.store().set_attempt_gpus(attempt.id, &gpus);
        let gpus_written = gpus_written.and_then(|_| {
            let r = self.store().set_attempt_started(job.id, attempt.id, since);
            r
        });
        let written = gpus_written.and_then(|_| {
            let r = self.store().set_running(job.id);
            r
        });
        match written {
            Ok(_) => self.store_ok(),
            Err(e) => self.store_failed(&format!("marking job {} running", job.id), &e),
        }
        append_log(&self.log_of(job.id), &format!("running as Slurm job {id} on {} ({})", j.nodes.as_deref().unwrap_or("?"), super::gpu_list(&gpus)));
        self.notify_job(job.id, JobState::Running);
    }

    /// The end of a job that left `squeue`, from the jobcomp/filetxt log.
    async fn jobcomp_record(&self, id: u64, task: Option<u32>, uid: u32) -> Option<sl::Completed> {
        let path = self.slurm().jobcomp.read().unwrap().clone()?;
        let text = tokio::fs::read(&path).await.ok()?;
        sl::parse_jobcomp_of(&String::from_utf8_lossy(&text), id, task, uid)
    }

    /// The last few KiB of a job's log.
    fn log_tail(&self, job_id: i64) -> Vec<u8> {
        let data = std::fs::read(self.log_of(job_id)).unwrap_or_default();
        data[data.len().saturating_sub(4096)..].to_vec()
    }

    /// Bytes of Slurm output already in the job's log: every line that is not Gantry's own.
    fn slurm_copied(&self, job_id: i64) -> u64 {
        let data = std::fs::read(self.log_of(job_id)).unwrap_or_default();
        data.split_inclusive(|c| *c == b'\n').filter(|l| !l.starts_with(b"[gantry ")).map(|l| l.len() as u64).sum()
    }

    /// Append new Slurm output (complete lines; everything at the end) to the job's log. The file is
    /// read as root from the user's folder, so it is opened without following links (see
    /// [`sl::read_output`]); a refusal is written to the log once and copying stops.
    async fn copy_slurm_output(&self, job: &Job, file: &str, copied: &mut u64, last: bool) {
        let Some(dir) = self.slurm().settings.log_dir.clone() else { return };
        if *copied == u64::MAX {
            return;
        }
        let (uid, name, from) = (job.owner_uid, file.to_string(), *copied);
        let read = tokio::task::spawn_blocking(move || sl::read_output(&dir, uid, &name, from)).await;
        let data = match read {
            Ok(Ok(d)) => d,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => return,
            Ok(Err(e)) => {
                append_log(&self.log_of(job.id), &format!("the job's output cannot be read safely ({e}); not copied"));
                warn!(job = job.id, "not copying Slurm output: {e}");
                *copied = u64::MAX;
                return;
            }
            Err(_) => return,
        };
        let take = if last { data.len() } else { data.iter().rposition(|c| *c == b'\n').map(|p| p + 1).unwrap_or(0) };
        if take == 0 {
            return;
        }
        let mut chunk = data[..take].to_vec();
        if !chunk.ends_with(b"\n") {
            chunk.push(b'\n');
        }
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let cap = self.policy().log_cap;
        let path = self.log_of(job.id);
        let wrote = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(&path).and_then(|mut f| {
            let len = f.metadata()?.len();
            if len >= cap {
                return Ok(());
            }
            f.write_all(&chunk)
        });
        match wrote {
            Ok(()) => *copied += take as u64,
            Err(e) => warn!(job = job.id, "cannot write the log of job {}: {e}", job.id),
        }
    }

    /// After a restart: follow every attempt Slurm has, and find the ones caught between `sbatch` and
    /// recording the id by their marker, so nothing is submitted twice.
    fn recover_slurm(self: Arc<Self>) -> Result<(), EngineError> {
        let open = self.store().open_attempts().map_err(|e| EngineError::Fatal(format!("cannot read the running jobs to follow them: {e}")))?;
        for (job, attempt) in open {
            let cancel = CancellationToken::new();
            {
                let mut r = self.running.lock().unwrap();
                if r.contains_key(&job.id) {
                    continue;
                }
                let mut h = handle(&job, cancel.clone());
                h.gpus = attempt.gpus.clone();
                h.container_id = attempt.slurm_job_id.map(|i| format!("slurm:{}", target(i, attempt.slurm_array_task)));
                r.insert(job.id, h);
            }
            let e = self.clone();
            self.supervise(job.id, async move { e.resume_slurm(job, attempt, cancel).await });
        }
        self.wake.notify_one();
        Ok(())
    }

    async fn resume_slurm(self: Arc<Self>, job: Job, attempt: Attempt, cancel: CancellationToken) {
        if job.cancel_requested {
            cancel.cancel(); // asked before the restart: scancel it now
        }
        let mut task = attempt.slurm_array_task;
        let r = match attempt.slurm_job_id {
            Some(id) => Resume::Follow(id),
            None => {
                let marker = sl::marker(&self.db_uid, job.id, attempt.n);
                // A matrix's first attempts may have gone as one array: its tasks carry the array's marker.
                let array = job.job.matrix_part.as_ref().filter(|_| attempt.n == 1).map(|p| (sl::array_marker(&self.db_uid, &p.group), p.index));
                let found = loop {
                    match self.slurm().client.queue().await {
                        Ok(jobs) => {
                            let single: Vec<u64> = sl::marked(&jobs, &marker, job.owner_uid);
                            if !single.is_empty() {
                                break single;
                            }
                            let Some((am, index)) = &array else { break vec![] };
                            let masters: Vec<u64> = sl::marked(&jobs, am, job.owner_uid);
                            if !masters.is_empty() {
                                task = Some(*index);
                            }
                            break masters;
                        }
                        Err(e) => {
                            warn!(job = job.id, "cannot look for job {} in Slurm yet: {e}", job.id);
                            tokio::select! {
                                _ = tokio::time::sleep(self.slurm().settings.poll) => {}
                                _ = self.shutdown.cancelled() => return,
                            }
                        }
                    }
                };
                sl::resume(None, &found)
            }
        };
        match r {
            Resume::Follow(id) => {
                info!(job = job.id, slurm = id, "following Slurm job again");
                self.follow_slurm(job, attempt, id, task, 0, cancel).await
            }
            Resume::Adopt(id) => {
                info!(job = job.id, slurm = id, "found in Slurm by its marker after a restart: not submitted again");
                if !self.record_slurm_id(job.id, &attempt, id, task).await {
                    return;
                }
                append_log(&self.log_of(job.id), &format!("found as Slurm job {} after an engine restart (not submitted again)", target(id, task)));
                self.follow_slurm(job, attempt, id, task, 0, cancel).await
            }
            Resume::NeverSubmitted => {
                let how = if job.cancel_requested { How::CancelledBeforeStart } else { How::NeverStarted };
                self.end_attempt(job.id, &attempt, &how, None).await
            }
        }
    }

    /// The cluster's GPUs for the GPUs view: one entry per GPU of each node (index counts across
    /// nodes), the node named in its name; which are allocated comes from Slurm.
    pub(super) fn slurm_gpus(&self) -> (Vec<crate::gpu::GpuSample>, Vec<(u32, Vec<i64>)>, Vec<crate::protocol::GpuUser>) {
        let nodes = self.slurm().nodes.read().unwrap().clone();
        let snap = self.slurm().snapshot.borrow().clone();
        let mut gpus = vec![];
        let mut holders = vec![];
        let mut users = vec![];
        let ours: Vec<(i64, &SqJob)> = {
            let r = self.running.lock().unwrap();
            r.iter()
                .filter_map(|(jid, h)| {
                    let t = h.container_id.as_deref()?.strip_prefix("slurm:")?;
                    let (id, task) = match t.split_once('_') {
                        Some((i, t)) => (i.parse::<u64>().ok()?, Some(t.parse::<u32>().ok()?)),
                        None => (t.parse::<u64>().ok()?, None),
                    };
                    sl::find_job(&snap.jobs, id, task).map(|j| (*jid, j))
                })
                .collect()
        };
        let mut index = 0u32;
        let now = now_ms();
        for n in &nodes {
            let live = self.slurm().settings.node_samples.as_deref().and_then(|d| crate::node_agent::read(d, &n.name, now));
            for g in 0..n.gpus {
                let name = format!("{} GPU {g}{} (Slurm node, {})", n.name, n.gpu_type.as_deref().map(|t| format!(" {t}")).unwrap_or_default(), n.state.to_lowercase());
                let mut s = crate::gpu::GpuSample {
                    index,
                    uuid: format!("slurm:{}:{g}", n.name),
                    name,
                    memory_total: 0,
                    memory_used: 0,
                    utilization: 0,
                    temperature_c: None,
                    power_w: None,
                    processes: vec![],
                    mig_parent: None,
                    links: vec![],
                };
                // Live figures from the node's agent, when it runs one.
                if let Some(x) = live.as_ref().and_then(|l| l.gpus.iter().find(|x| x.index == g)) {
                    s.name = format!("{} GPU {g}: {} (Slurm node, {})", n.name, x.name, n.state.to_lowercase());
                    s.memory_total = x.memory_total;
                    s.memory_used = x.memory_used;
                    s.utilization = x.utilization;
                    s.temperature_c = x.temperature_c;
                    s.power_w = x.power_w;
                    s.uuid = x.uuid.clone();
                }
                let mine: Vec<i64> = ours.iter().filter(|(_, j)| j.nodes.as_deref() == Some(n.name.as_str()) && j.gpu_indexes().contains(&g)).map(|(id, _)| *id).collect();
                if n.gpus_used.contains(&g) {
                    if mine.is_empty() {
                        users.push(crate::protocol::GpuUser { gpu: index, job_id: None, job_name: None, user: None, pid: None, command: Some("allocated by Slurm to another job".into()), container: None, used_memory: None, since: None });
                    }
                }
                if !mine.is_empty() {
                    holders.push((index, mine));
                }
                gpus.push(s);
                index += 1;
            }
        }
        (gpus, holders, users)
    }
}

fn how_of(e: SubmitError) -> How {
    match e {
        SubmitError::Refused(m) => How::Refused(m),
        SubmitError::Failed { message, transient } => How::StartFailed { message, transient },
    }
}

/// How Slurm names a job or an array's task: `ID`, `ID_TASK`.
fn target(id: u64, task: Option<u32>) -> String {
    match task {
        Some(t) => format!("{id}_{t}"),
        None => id.to_string(),
    }
}

fn handle(job: &Job, cancel: CancellationToken) -> RunHandle {
    RunHandle {
        owner: job.owner.clone(),
        gpus: vec![],
        gpu_memory: job.gpu_memory,
        container_id: None,
        cancel,
        monitored: true,
        expected_end: None,
        learn: None,
        needs: Default::default(),
    }
}
