//! One owned task per attempt: launch the container, follow its output, enforce timeout and cancel,
//! and record its end exactly once. The container is removed only after its end is committed.

use std::future::Future;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::outcome::{outcome, How, Policy};
use super::{append_log, gpu_list, Engine};
use crate::config::{DOCKER_RETRY, RETRY_BACKOFF_MAX, STORE_RETRY, TRANSIENT_RETRY_MS};
use crate::access::{self, Cred};
use crate::executor::{ExecError, Executor, GpuBinding, Launch};
use crate::gpu::BackendKind;
use crate::store::{now_ms, Attempt, Job, JobState};

/// After a container exits, its log copy gets this long to drain before the end is recorded.
const LOG_DRAIN: Duration = Duration::from_secs(10);
/// Before the last read of an exited container's stored output: Docker's log copier may trail the exit.
const CATCH_UP_DELAY: Duration = Duration::from_millis(200);

impl Engine {
    /// Run an attempt's supervisor as an owned task. If it panics, the attempt is ended (its container
    /// stopped) so its GPUs are not held forever.
    pub(super) fn supervise(self: &Arc<Self>, job_id: i64, fut: impl Future<Output = ()> + Send + 'static) {
        let e = self.clone();
        self.tasks.spawn(async move {
            if let Err(p) = AssertUnwindSafe(fut).catch_unwind().await {
                let why = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_else(|| "panic".into());
                error!(job = job_id, "the supervisor of job {job_id} crashed: {why}");
                e.supervisor_crashed(job_id, why).await;
            }
        });
    }

    async fn supervisor_crashed(self: Arc<Self>, job_id: i64, why: String) {
        let cid = self.running.lock().unwrap().get(&job_id).and_then(|h| h.container_id.clone());
        if let Some(c) = &cid {
            if let Err(e) = self.exec.stop(c, self.policy().stop_grace).await {
                warn!(job = job_id, "could not stop the container of a crashed supervisor: {e}");
            }
        }
        let open = self.store().open_attempt(job_id);
        match open {
            Ok(Some(a)) => self.end_attempt(job_id, &a, &How::EngineFault(why), cid.as_deref()).await,
            _ => {
                self.running.lock().unwrap().remove(&job_id);
                self.wake.notify_one();
            }
        }
    }

    pub(super) async fn launch(self: Arc<Self>, job: Job, attempt: Attempt, gpu_total: Option<u64>, needs: crate::scheduler::CpuRam, cancel: CancellationToken) {
        let log = self.log_of(job.id);
        append_log(&log, &format!("attempt {} of job {} on {}", attempt.n, job.id, gpu_list(&attempt.gpus)));
        let binding = if self.backend_kind == BackendKind::Nvml { GpuBinding::Nvidia } else { GpuBinding::EnvOnly };
        let mut created: Option<String> = None;
        let started = async {
            self.exec.ensure_image(&job.image).await?;
            // The lab may have changed since the submit: `ipc: host` and `home: mount` are checked again.
            let policy = self.policy();
            policy.containers.check(&job.job, &|k| self.set_in(k))?;
            let home = Self::home_of(job.owner_uid);
            // The owner's home as HOME is a mount like any other: checked as them, pinned below.
            let mut mounts = job.job.mounts.clone();
            mounts.extend(policy.containers.home_mount(&job.job, home.as_deref()));
            // Paths change while a job waits: check the mounts as the owner again, right before create.
            let cred = Cred::of_user(job.owner_uid, job.owner_gid);
            let checked = access::check_mounts_async(cred.clone(), mounts, job.job.spec.workdir.clone(), self.forbidden()).await?;
            // Docker gets paths the owner cannot swap: the checked files, pinned (released in end_attempt).
            let name = self.container_name(job.id, attempt.n);
            let mounts = self.staging().stage(&name, checked)?;
            let l = Launch {
            engine_id: &self.engine_id,
            db_uid: &self.db_uid,
            name,
            job_id: job.id,
            attempt_id: attempt.id,
            attempt_n: attempt.n,
            job: &job.job,
            uid: job.owner_uid,
            gid: job.owner_gid,
            groups: cred.groups,
            mounts,
            gpus: attempt.gpus.clone(),
            gpu_uuids: attempt.gpu_uuids.clone(),
            gpu_total_memory: gpu_total,
            binding,
            container: policy.containers.settings(&job.job, needs, &self.machine, home.as_deref()),
        };
            let cid = self.exec.create(&l).await?;
            created = Some(cid.clone());
            // If this write fails the container is still found by its name at recovery.
            let recorded = self.store().set_container(attempt.id, &cid);
            if let Err(e) = recorded {
                self.store_failed(&format!("recording the container of job {}", job.id), &e);
            }
            if let Some(h) = self.running.lock().unwrap().get_mut(&job.id) {
                h.container_id = Some(cid.clone());
            }
            let claim: Vec<(u32, String)> = attempt.gpus.iter().copied().zip(attempt.gpu_uuids.iter().cloned()).collect();
            if let Some(other) = self.exec.gpu_taken(&cid, &self.engine_id, &claim).await? {
                return Err(EngineError::Exec(ExecError::GpuTaken(format!(
                    "{} was taken at the same moment by container {other}, outside this engine; trying again shortly",
                    gpu_list(&attempt.gpus)
                ))));
            }
            let cancel_requested = self.store().job(job.id).ok().flatten().is_some_and(|j| j.cancel_requested);
            if cancel.is_cancelled() || cancel_requested {
                return Ok((cid, false));
            }
            self.exec.start(&cid).await?;
            Ok::<_, EngineError>((cid, true))
        }
        .await;
        match started {
            Ok((cid, true)) => {
                let marked = self.store().set_running(job.id);
                match marked {
                    Ok(_) => self.store_ok(),
                    Err(e) => self.store_failed(&format!("marking job {} running", job.id), &e),
                }
                self.notify_job(job.id, JobState::Running);
                info!(job = job.id, container = %&cid[..12.min(cid.len())], "job running");
                self.monitor(job, attempt, cid, cancel).await;
            }
            Ok((cid, false)) => self.end_attempt(job.id, &attempt, &How::CancelledBeforeStart, Some(&cid)).await,
            Err(e) => {
                append_log(&log, &format!("could not start: {e}"));
                warn!(job = job.id, "could not start: {e}");
                let how = match &e {
                    EngineError::Spec(s) => How::Refused(s.to_string()),
                    EngineError::Exec(x) => How::StartFailed { message: e.to_string(), transient: x.is_transient() },
                    _ => How::StartFailed { message: e.to_string(), transient: false },
                };
                self.end_attempt(job.id, &attempt, &how, created.as_deref()).await;
            }
        }
    }

    /// Follow a started container to its end: logs, timeout, cancel, then record the outcome once.
    pub(super) async fn monitor(self: Arc<Self>, job: Job, attempt: Attempt, cid: String, cancel: CancellationToken) {
        let log_stop = CancellationToken::new();
        let logs = {
            let (exec, cid, path, cap, stop) = (self.exec.clone(), cid.clone(), self.log_of(job.id), self.policy().log_cap, log_stop.clone());
            tokio::spawn(async move {
                if let Err(e) = follow_logs(exec, &cid, &path, cap, stop).await {
                    warn!("log copy for {cid}: {e}");
                }
            })
        };
        let deadline = job.timeout_ms.map(|t| attempt.started_at + t);
        let until_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep(Duration::from_millis((d - now_ms()).max(0) as u64)).await,
                None => std::future::pending().await,
            }
        };
        let exec = self.exec.clone();
        let waited = async {
            loop {
                match exec.wait(&cid).await {
                    Err(ExecError::DockerUnavailable(m)) => {
                        warn!(job = job.id, "lost contact with Docker while waiting ({m}); retrying");
                        tokio::time::sleep(DOCKER_RETRY).await;
                    }
                    r => return r,
                }
            }
        };
        tokio::pin!(waited);
        enum Stop {
            Timeout,
            Cancel,
        }
        let stop = tokio::select! {
            r = &mut waited => Err(r),
            _ = until_deadline => Ok(Stop::Timeout),
            _ = cancel.cancelled() => Ok(Stop::Cancel),
            _ = self.shutdown.cancelled() => {
                // Leave it running; it is reattached on the next start.
                log_stop.cancel();
                let _ = logs.await;
                return;
            }
        };
        let (stop, result) = match stop {
            Err(r) => (None, r),
            Ok(s) => {
                if let Err(e) = self.exec.stop(&cid, self.policy().stop_grace).await {
                    warn!(job = job.id, "stop failed: {e}");
                }
                (Some(s), waited.await)
            }
        };
        // The container has ended: its log stream ends too, unless Docker is flaky.
        let mut logs = logs;
        if tokio::time::timeout(LOG_DRAIN, &mut logs).await.is_err() {
            log_stop.cancel();
            let _ = logs.await;
        }
        let code = result.as_ref().ok().map(|x| x.code);
        let how = match (stop, result) {
            (Some(Stop::Timeout), _) => How::TimedOut { code, timeout_ms: job.timeout_ms.unwrap_or(0) },
            (Some(Stop::Cancel), _) => How::Cancelled { code },
            (None, Ok(x)) => How::Exited { code: x.code, oom: x.oom_killed },
            (None, Err(e)) => How::Lost(format!("container vanished: {e}")),
        };
        self.end_attempt(job.id, &attempt, &how, Some(&cid)).await;
    }

    /// An attempt whose container exited while the engine was away: copy the output we missed, then
    /// record its real exit code.
    pub(super) async fn record_exited(self: Arc<Self>, job: Job, attempt: Attempt, cid: String) {
        if let Err(e) = follow_logs(self.exec.clone(), &cid, &self.log_of(job.id), self.policy().log_cap, self.shutdown.clone()).await {
            warn!(job = job.id, "could not copy the output of {cid}: {e}");
        }
        let how = match self.exec.exit_of(&cid).await {
            Ok(Some(x)) => How::ExitedWhileAway { code: x.code, oom: x.oom_killed },
            Ok(None) => How::Lost("its container claims to run but was listed as exited".into()),
            Err(e) => How::Lost(format!("its container state is unreadable: {e}")),
        };
        self.end_attempt(job.id, &attempt, &how, Some(&cid)).await;
    }

    /// Record how an attempt ended, retrying the write until it succeeds (nothing new starts meanwhile),
    /// then free its GPUs and remove its container. On shutdown before the write succeeds, the container
    /// is left for recovery to record.
    pub(super) async fn end_attempt(&self, job_id: i64, attempt: &Attempt, how: &How, container: Option<&str>) {
        let job = self.store().job(job_id);
        let retries = match job {
            Ok(Some(j)) => j.retries,
            _ => 0,
        };
        let policy = Policy {
            retries,
            attempt_n: attempt.n,
            backoff_ms: self.policy().retry_backoff.as_millis() as i64,
            backoff_max_ms: RETRY_BACKOFF_MAX.as_millis() as i64,
            transient_retry_ms: TRANSIENT_RETRY_MS,
            now_ms: now_ms(),
        };
        let end = outcome(how, &policy);
        append_log(&self.log_of(job_id), &format!("attempt {} ended: {}", attempt.n, end.message.clone().unwrap_or_else(|| end.next.as_str().into())));
        loop {
            let written = self.store().end_attempt(job_id, attempt.id, &end);
            match written {
                Ok(()) => {
                    self.store_ok();
                    break;
                }
                Err(e) => {
                    self.store_failed(&format!("recording the end of job {job_id}"), &e);
                    tokio::select! {
                        _ = tokio::time::sleep(STORE_RETRY) => {}
                        _ = self.shutdown.cancelled() => return,
                    }
                }
            }
        }
        self.running.lock().unwrap().remove(&job_id);
        info!(job = job_id, state = end.next.as_str(), "attempt ended");
        self.notify_job(job_id, end.next);
        self.wake.notify_one();
        if let Some(cid) = container {
            // Safe to remove now that its end is committed; if this fails, recovery removes it later.
            if let Err(e) = self.exec.remove(cid).await {
                warn!(job = job_id, "could not remove container {cid}: {e}");
            }
        }
        // The attempt never starts again: its pinned mounts can go (a running container keeps its own copy).
        self.release_staging(&self.container_name(job_id, attempt.n));
    }

    /// The engine cannot trust its state: stop loudly.
    pub(super) fn fatal(&self, e: EngineError) {
        error!("{e}");
        self.health.write().unwrap().store_problem = Some(e.to_string());
        self.shutdown.cancel();
    }
}

use super::EngineError;

/// A Docker log line's timestamp (`2026-01-02T03:04:05.123456789Z text`), as nanoseconds since the epoch.
fn line_ts(line: &[u8]) -> Option<i128> {
    if !line.first().is_some_and(u8::is_ascii_digit) {
        return None;
    }
    let end = line.iter().position(|c| *c == b' ').unwrap_or(line.len());
    let t = humantime::parse_rfc3339(std::str::from_utf8(&line[..end]).ok()?).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos() as i128)
}

/// Open a job's log to append more output: drop a partial last line (an engine killed mid-write) and
/// return the timestamp of the last Docker line, where to resume.
fn open_for_resume(path: &Path) -> std::io::Result<(std::fs::File, Option<i128>)> {
    let mut f = std::fs::OpenOptions::new().create(true).truncate(false).read(true).write(true).mode(0o600).open(path)?;
    let len = f.metadata()?.len();
    let from = len.saturating_sub(1 << 20);
    f.seek(SeekFrom::Start(from))?;
    let mut tail = vec![];
    f.read_to_end(&mut tail)?;
    let keep = match tail.iter().rposition(|c| *c == b'\n') {
        Some(p) => p + 1,
        None if from == 0 => 0,
        None => tail.len(),
    };
    if keep < tail.len() {
        f.set_len(from + keep as u64)?;
    }
    let last = tail[..keep].split(|c| *c == b'\n').rev().find_map(line_ts);
    f.seek(SeekFrom::End(0))?;
    Ok((f, last))
}

/// Copy a container's output into `path` until the container ends, surviving Docker outages and engine
/// restarts: each (re)connection asks for output since the last line written and skips what is already
/// there, so every line lands exactly once, in order. Capped at `cap` bytes.
pub(crate) async fn follow_logs(exec: Arc<dyn Executor>, cid: &str, path: &Path, cap: u64, stop: CancellationToken) -> std::io::Result<()> {
    let (mut f, mut last) = open_for_resume(path)?;
    let mut written = f.metadata()?.len();
    let mut truncated = written >= cap;
    let mut put = |line: &[u8], last: &mut Option<i128>| -> std::io::Result<()> {
        let ts = line_ts(line);
        if let (Some(t), Some(l)) = (ts, *last) {
            if t <= l {
                return Ok(()); // already copied before a reconnect
            }
        }
        if ts.is_some() {
            *last = ts;
        }
        if truncated {
            return Ok(());
        }
        if written + line.len() as u64 > cap {
            f.write_all(format!("[gantry] log truncated: the job wrote more than {cap} bytes\n").as_bytes())?;
            truncated = true;
            return Ok(());
        }
        written += line.len() as u64;
        f.write_all(line)
    };
    loop {
        let since = last.map(|t| (t / 1_000_000_000) as i64).unwrap_or(0);
        let mut s = exec.logs(cid, since, true);
        let mut pending: Vec<u8> = vec![];
        let broken = loop {
            let item = tokio::select! {
                i = s.next() => i,
                _ = stop.cancelled() => return Ok(()),
            };
            match item {
                None => break false,
                Some(Err(_)) => break true,
                Some(Ok(b)) => {
                    pending.extend_from_slice(&b);
                    while let Some(p) = pending.iter().position(|c| *c == b'\n') {
                        let line: Vec<u8> = pending.drain(..=p).collect();
                        put(&line, &mut last)?;
                    }
                }
            }
        };
        if !broken {
            match exec.exit_of(cid).await {
                Ok(Some(_)) => {
                    // A follow that began as the container exited can end before Docker has stored the
                    // last output: read what is stored once more (lines already copied are skipped).
                    tokio::time::sleep(CATCH_UP_DELAY).await;
                    let since = last.map(|t| (t / 1_000_000_000) as i64).unwrap_or(0);
                    let mut rest = exec.logs(cid, since, false);
                    let mut tail: Vec<u8> = vec![];
                    while let Some(Ok(b)) = rest.next().await {
                        tail.extend_from_slice(&b);
                    }
                    // The final partial line, if any, is in both `pending` and `tail`: keep the fresher read.
                    let tail = if tail.is_empty() { pending } else { tail };
                    for line in tail.split_inclusive(|c| *c == b'\n') {
                        let mut line = line.to_vec();
                        if !line.ends_with(b"\n") {
                            line.push(b'\n');
                        }
                        put(&line, &mut last)?;
                    }
                    return Ok(());
                }
                Err(ExecError::NotFound(_)) => {
                    if !pending.is_empty() {
                        pending.push(b'\n');
                        put(&pending, &mut last)?;
                    }
                    return Ok(());
                }
                Err(ExecError::Rejected(_)) => return Ok(()),
                _ => {} // still running (Docker restarted the stream) or Docker away: follow again
            }
        }
        // A partial line from a cut stream is read again after reconnecting.
        tokio::select! {
            _ = tokio::time::sleep(DOCKER_RETRY) => {}
            _ = stop.cancelled() => return Ok(()),
        }
    }
}
