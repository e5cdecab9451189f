//! One owned task per attempt, whatever runs it: launch it through the backend, follow it (timeout,
//! cancel, shutdown) through the backend's [`Watch`], and record its end exactly once. What the
//! attempt leaves behind (a container) is released only after its end is committed.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::backend::{Launched, Placed, Seen, Since};
use super::{append_log, Engine, EngineError};
use crate::config::{RETRY_BACKOFF_MAX, STORE_RETRY, TRANSIENT_RETRY_MS};
use crate::outcome::{outcome, How, RetryPolicy, Stop};
use crate::store::{Attempt, Job, RunRef};

/// A stop the backend could not carry out (`scancel` failed) is asked again after this long.
const STOP_RETRY: Duration = Duration::from_secs(1);

impl Engine {
    /// Run an attempt's supervisor as an owned task. If it panics, the attempt is ended (what runs it
    /// stopped) so its GPUs are not held forever.
    pub(super) fn supervise(self: &Arc<Self>, job_id: i64, fut: impl Future<Output = ()> + Send + 'static) {
        let e = self.clone();
        self.tasks.spawn(async move {
            if let Err(p) = AssertUnwindSafe(fut).catch_unwind().await {
                let why = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "panic".into());
                error!(job = job_id, "the supervisor of job {job_id} crashed: {why}");
                e.supervisor_crashed(job_id, why).await;
            }
        });
    }

    async fn supervisor_crashed(self: Arc<Self>, job_id: i64, why: String) {
        let run = self.running.lock().unwrap().get(&job_id).and_then(|h| h.run.clone());
        if let Some(r) = &run {
            let job = self.store().job(job_id);
            match job {
                Ok(Some(job)) => self.backend.abort(&self, &job, r).await,
                _ => warn!(
                    job = job_id,
                    "cannot read job {job_id} to stop {r} of its crashed supervisor"
                ),
            }
        }
        let open = self.store().open_attempt(job_id);
        match open {
            Ok(Some(a)) => self.end_attempt(job_id, &a, &How::EngineFault(why), run.as_ref()).await,
            _ => {
                self.running.lock().unwrap().remove(&job_id);
                self.wake.notify_one();
            }
        }
    }

    /// A claimed attempt: launch it, follow it to its end, record the end.
    pub(super) async fn run_attempt(
        self: Arc<Self>,
        job: Job,
        attempt: Attempt,
        placed: Placed,
        cancel: CancellationToken,
    ) {
        let launched = self.backend.launch(&self, &job, &attempt, &placed, &cancel).await;
        match launched {
            Launched::Started { run, at } => self.follow(job, attempt, run, cancel, Since::Launched { at }).await,
            Launched::Ended { how, run } => self.end_attempt(job.id, &attempt, &how, run.as_ref()).await,
            Launched::Shutdown => {}
        }
    }

    /// Claimed attempts launched as one (a Slurm job array), then each followed by its own task.
    pub(super) async fn run_together(self: Arc<Self>, parts: Vec<(Job, Attempt, CancellationToken)>, placed: Placed) {
        let launched = self.backend.launch_together(&self, &parts, &placed).await;
        for ((job, attempt, cancel), l) in parts.into_iter().zip(launched) {
            match l {
                Launched::Started { run, at } => {
                    let e = self.clone();
                    self.supervise(job.id, e.follow(job, attempt, run, cancel, Since::Launched { at }));
                }
                Launched::Ended { how, run } => self.end_attempt(job.id, &attempt, &how, run.as_ref()).await,
                Launched::Shutdown => return,
            }
        }
    }

    /// Follow a launched or recovered attempt to its end: its timeout counts from when the backend
    /// says it runs; a cancel or the timeout asks the backend to stop it (again, until it could);
    /// on shutdown it is left running. Then its end is recorded, once.
    pub(super) async fn follow(
        self: Arc<Self>,
        job: Job,
        attempt: Attempt,
        run: RunRef,
        cancel: CancellationToken,
        since: Since,
    ) {
        let mut watch = self.backend.watch(&self, &job, &attempt, &run, since);
        let mut stop: Option<Stop> = None;
        let preempt = self
            .running
            .lock()
            .unwrap()
            .get(&job.id)
            .map(|h| h.preempt.clone())
            .unwrap_or_default();
        // An engine killed mid-preemption: the preemption recorded on the attempt goes on.
        if matches!(self.reader().preempting(attempt.id), Ok(Some(_))) {
            preempt.cancel();
        }
        let mut running_since: Option<i64> = None;
        // Its results, read while it runs and once more at its end.
        let reading = self.read_results(&job, &attempt, &run);
        let how = loop {
            let deadline = running_since
                .zip(job.timeout_ms)
                .map(|(s, t)| s + t)
                .filter(|_| stop.is_none());
            let until_deadline = async {
                match deadline {
                    Some(d) => self.sleep_until_ms(d).await,
                    None => std::future::pending().await,
                }
            };
            // What the backend says comes first: an attempt that ended is recorded as it ended.
            let want = tokio::select! {
                biased;
                seen = watch.next() => match seen {
                    Some(Seen::Running { since }) => {
                        running_since = Some(since);
                        None
                    }
                    Some(Seen::Ended(how)) => break how,
                    None => {
                        reading.abort();
                        return;
                    }
                },
                _ = cancel.cancelled(), if stop.is_none() || stop == Some(Stop::Preempt) => Some(if self.over_memory_reason(job.id).is_some() { Stop::GpuMemory } else { Stop::Cancel }),
                _ = preempt.cancelled(), if stop.is_none() => Some(Stop::Preempt),
                _ = until_deadline => Some(Stop::Timeout),
                _ = self.shutdown.cancelled() => {
                    // Leave it running; it is followed again on the next start.
                    watch.detach().await;
                    reading.abort();
                    return;
                }
            };
            if let Some(why) = want {
                // A preemption's stop waits out the job's checkpoint grace (an hour, if it says so):
                // its owner's or root's cancel meanwhile is not held up by it. The preemption's stop
                // is dropped (its signal was sent) and the next turn stops the job as a cancel: the
                // lab's stop grace, then SIGKILL.
                let done = if why == Stop::Preempt {
                    tokio::select! {
                        biased;
                        _ = cancel.cancelled() => None,
                        s = watch.stop(why) => Some(s),
                    }
                } else {
                    Some(watch.stop(why).await)
                };
                match done {
                    Some(true) => stop = Some(why),
                    Some(false) => tokio::time::sleep(STOP_RETRY).await,
                    None => stop = Some(Stop::Preempt),
                }
            }
        };
        let how = match (stop, how) {
            // Cancelled while its preemption ran: the cancel wins (it is not queued again).
            (_, How::Preempted { code, .. }) if cancel.is_cancelled() => How::Cancelled { code },
            (Some(Stop::Preempt), How::Exited { code, .. }) if cancel.is_cancelled() => {
                How::Cancelled { code: Some(code) }
            }
            (Some(Stop::GpuMemory), How::Cancelled { code }) => How::GpuMemoryExceeded {
                code,
                message: self
                    .over_memory_reason(job.id)
                    .unwrap_or_else(|| "stopped: more GPU memory than declared".into()),
            },
            (_, how) => how,
        };
        reading.finish().await;
        self.end_attempt(job.id, &attempt, &how, Some(&run)).await;
        // Ended for good: what it logged is in the store, its results folder goes.
        let e = self.clone();
        let _ = tokio::task::spawn_blocking(move || e.remove_results_dir_if_ended(job.id)).await;
    }

    /// Why a running job is being stopped for its GPU memory, if it is.
    fn over_memory_reason(&self, job_id: i64) -> Option<String> {
        self.running
            .lock()
            .unwrap()
            .get(&job_id)
            .and_then(|h| h.over_memory.as_ref().and_then(|o| o.1.clone()))
    }

    /// Record how an attempt ended, retrying the write until it succeeds (nothing new starts meanwhile),
    /// then free its GPUs and release what it leaves (its container). On shutdown before the write
    /// succeeds, that is left for recovery to record.
    pub(super) async fn end_attempt(&self, job_id: i64, attempt: &Attempt, how: &How, run: Option<&RunRef>) {
        let job = self.store().job(job_id);
        let (retries, checkpoint) = match &job {
            Ok(Some(j)) => (j.retries, j.job.spec.checkpoint_signal()),
            _ => (0, String::new()),
        };
        // Attempts that ended by preemption do not count against `retries`.
        let preempted = self.reader().preemptions(job_id, 0).map(|p| p.0).unwrap_or(0);
        let recorded = self.reader().preempting(attempt.id).ok().flatten();
        let how = &match (how, recorded) {
            // An attempt being preempted ends preempted however it exited (a checkpointing job may
            // exit 0; an engine killed mid-preemption finds it ended or gone): it is queued again.
            (How::Exited { code, .. } | How::ExitedWhileAway { code, .. }, Some((_, by))) => {
                How::Preempted { code: Some(*code), by }
            }
            (How::Lost(_), Some((_, by))) => How::Preempted { code: None, by },
            (How::Preempted { code, .. }, Some((_, by))) => How::Preempted { code: *code, by },
            (How::Preempted { code, by }, None) if by.is_empty() => How::Preempted {
                code: *code,
                by: "the scheduler".into(),
            },
            (other, _) => other.clone(),
        };
        // What it had used of its GPUs this attempt (what the preemption cost, at most).
        let how = &match how {
            How::Preempted { code, by } => {
                // As recorded now: the Slurm backend writes the GPUs and the start Slurm gave it.
                let recorded = self
                    .reader()
                    .open_attempt(job_id)
                    .ok()
                    .flatten()
                    .filter(|a| a.id == attempt.id);
                let a = recorded.as_ref().unwrap_or(attempt);
                let gpus = a.gpus.len().max(1) as i64;
                How::Preempted {
                    code: *code,
                    by: format!("{by} after {}", gpu_time((self.now() - a.started_at).max(0) * gpus)),
                }
            }
            other => other.clone(),
        };
        let policy = RetryPolicy {
            retries,
            attempt_n: attempt.n.saturating_sub(preempted),
            backoff_ms: self.policy().retry_backoff.as_millis() as i64,
            backoff_max_ms: RETRY_BACKOFF_MAX.as_millis() as i64,
            transient_retry_ms: TRANSIENT_RETRY_MS,
            now_ms: self.now(),
        };
        let end = outcome(how, &policy);
        if let How::Preempted { code: Some(code), .. } = how {
            if let Some(line) = unhandled_checkpoint(&checkpoint, *code) {
                append_log(&self.log_of(job_id), &line);
            }
        }
        append_log(
            &self.log_of(job_id),
            &format!(
                "attempt {} ended: {}",
                attempt.n,
                end.message.clone().unwrap_or_else(|| end.next.as_str().into())
            ),
        );
        // Its last figures, before its end (then its measures stop).
        self.save_efficiency(job_id, attempt.id);
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
        if let Some(cid) = run.and_then(RunRef::container) {
            self.leaving.lock().unwrap().insert(cid.to_string(), self.now());
        }
        self.running.lock().unwrap().remove(&job_id);
        if let How::Preempted { by, .. } = how {
            self.preempted_at
                .lock()
                .unwrap()
                .insert(job_id, (self.now(), by.clone()));
        }
        info!(job = job_id, state = end.next.as_str(), "attempt ended");
        self.notify_job(job_id, end.next);
        self.wake.notify_one();
        // Safe now that its end is committed; if this fails, recovery cleans up later.
        self.backend.release(self, job_id, attempt, run).await;
    }

    /// The engine cannot trust its state: stop loudly.
    pub(super) fn fatal(&self, e: EngineError) {
        error!("{e}");
        self.health.write().unwrap().store_problem = Some(e.to_string());
        self.shutdown.cancel();
    }
}

/// The log line for a preempted attempt that ended by its own checkpoint signal (exit 128 + its
/// number, as Docker's init and a shell report it): its program does not handle it, so it most likely
/// saved nothing. `None` for any other exit.
pub(super) fn unhandled_checkpoint(signal: &str, code: i64) -> Option<String> {
    let sig: nix::sys::signal::Signal = signal.parse().ok()?;
    (code == 128 + sig as i64).then(|| {
        format!(
            "the job ended by its checkpoint signal {signal} (exit {code}), which its program does not handle: \
             it most likely saved nothing. Handle {signal} in the program (Python: `signal.signal(signal.{signal}, \
             save_and_exit)`), or set `checkpoint: {{signal: ...}}` to the signal it saves on"
        )
    })
}

/// GPU time an attempt used, as its preemption says it: "12 GPU-minutes", under a minute "40
/// GPU-seconds" (not "0 GPU-minutes"), one of either singular.
pub(super) fn gpu_time(gpu_ms: i64) -> String {
    let (n, unit) = if gpu_ms < 60_000 {
        (gpu_ms / 1000, "GPU-second")
    } else {
        (gpu_ms / 60_000, "GPU-minute")
    };
    format!("{n} {unit}{}", if n == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_short_run_before_its_preemption_is_not_0_gpu_minutes() {
        assert_eq!(super::gpu_time(8_400), "8 GPU-seconds");
        assert_eq!(super::gpu_time(1_000), "1 GPU-second");
        assert_eq!(super::gpu_time(60_000), "1 GPU-minute");
        assert_eq!(super::gpu_time(600_000), "10 GPU-minutes");
    }

    #[test]
    fn a_job_killed_by_its_own_checkpoint_signal_is_told_so() {
        let line = super::unhandled_checkpoint("SIGUSR1", 138).unwrap();
        assert!(
            line.starts_with(
                "the job ended by its checkpoint signal SIGUSR1 (exit 138), which its program does not handle"
            ),
            "{line}"
        );
        assert!(super::unhandled_checkpoint("SIGTERM", 143).is_some());
        assert_eq!(super::unhandled_checkpoint("SIGUSR1", 0), None);
        assert_eq!(super::unhandled_checkpoint("SIGUSR1", 143), None);
    }
}
