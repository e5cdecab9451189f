//! Following one Slurm job (or array task) to its end through the tracker's `squeue` snapshots:
//! "why waiting" while it pends, running (with the node's GPUs it got), its output copied into the
//! job's log through the shared capped path, its end from `squeue` or, once it left `squeue`, from
//! the jobcomp log; cancel and timeout as `scancel` by its owner.

use std::sync::Arc;

use tokio::sync::watch as channel;
use tracing::warn;

use super::{owner, submit, Shared, Snapshot};
use crate::engine::backend::{Seen, Since, Watch};
use crate::engine::joblog::{is_gantrys, is_progress, CappedLog, Lines};
use crate::engine::{append_log, gpu_list, Engine};
use crate::outcome::{How, Stop};
use crate::scheduler::Waiting;
use crate::slurm::{self as sl, As, SqJob};
use crate::store::{Attempt, Job, JobState, RunRef};

pub(super) struct SlurmWatch {
    e: Arc<Engine>,
    s: Arc<Shared>,
    job: Job,
    attempt: Attempt,
    id: u64,
    task: Option<u32>,
    /// Only snapshots taken after this (ms) are sure to show the job.
    since: i64,
    rx: channel::Receiver<Arc<Snapshot>>,
    who: As,
    /// Why Gantry stopped it (its `scancel` went through).
    stop: Option<Stop>,
    running_since: Option<i64>,
    /// Snapshots in a row without it, and its end not in the jobcomp log either.
    missing: u32,
    /// Bytes of its output file already copied (`u64::MAX`: copying stopped, the file is unsafe).
    copied: u64,
    /// Its output file, in its owner's folder of the shared log dir.
    file: String,
    /// The job's log, open for its output (opened at the first copy).
    log: Option<CappedLog>,
    /// Its output cut into lines, and the progress state last written.
    lines: Lines,
    progress: Vec<u8>,
    shown: String,
    /// How often Slurm had requeued this Slurm job when this attempt began following it (the earlier
    /// attempts that followed it): a higher restart count means it was requeued again.
    base: u32,
    /// Its checkpoint signal and grace (preemptible jobs).
    checkpoint: Option<sl::Checkpoint>,
    /// Gantry preempts it: requeue it at this time (ms) unless it was requeued already.
    preempting: Option<(i64, bool)>,
}

impl SlurmWatch {
    pub fn new(e: Arc<Engine>, s: Arc<Shared>, job: &Job, attempt: &Attempt, run: &RunRef, since: Since) -> SlurmWatch {
        let (id, task) = match run {
            RunRef::Slurm { id, task } => (*id, *task),
            // Never handed a container: a watcher that finds nothing and reports it lost.
            RunRef::Container(_) => (0, None),
        };
        // A requeued Slurm job is followed by the attempt after the one that submitted it: its
        // output file is the submitting attempt's.
        let (base, first) = submit::followed(&e, job.id, attempt, run);
        let file = output_file(&e, job, run, first);
        SlurmWatch {
            rx: s.snapshot.subscribe(),
            since: match since {
                Since::Launched { at } => at,
                Since::Recovered | Since::EndedWhileAway => 0,
            },
            who: owner(job),
            stop: None,
            running_since: None,
            missing: 0,
            copied: copied(&e, job.id, &file),
            file,
            log: None,
            lines: Lines::default(),
            progress: vec![],
            shown: run.to_string(),
            base,
            checkpoint: submit::checkpoint(&e, job),
            preempting: None,
            job: job.clone(),
            attempt: attempt.clone(),
            id,
            task,
            e,
            s,
        }
    }

    /// Slurm started the job: mark it running, with the node's GPUs it got.
    fn running(&self, j: &SqJob, since: i64) {
        let (e, job) = (&self.e, &self.job);
        e.waiting.write().unwrap().remove(&job.id);
        let gpus = j.gpu_indexes();
        if let Some(h) = e.running.lock().unwrap().get_mut(&job.id) {
            h.gpus = gpus.clone();
            // Its `min_run` and GPU-minutes count from Slurm's start, not from the submit.
            if let Some(v) = h.victim.as_mut() {
                v.started_ms = since;
            }
        }
        // One store guard per statement: a second `e.store()` inside the first's expression would deadlock.
        let gpus_written = e.store().set_attempt_gpus(self.attempt.id, &gpus);
        let gpus_written = gpus_written.and_then(|_| {
            let r = e.store().set_attempt_started(job.id, self.attempt.id, since);
            r
        });
        let written = gpus_written.and_then(|_| {
            let r = e.store().set_running(job.id);
            r
        });
        match written {
            Ok(_) => e.store_ok(),
            Err(err) => e.store_failed(&format!("marking job {} running", job.id), &err),
        }
        append_log(
            &e.log_of(job.id),
            &format!(
                "running as Slurm job {} on {} ({})",
                self.shown,
                j.nodes.as_deref().unwrap_or("?"),
                gpu_list(&gpus)
            ),
        );
        e.notify_job(job.id, JobState::Running);
    }

    /// The end of a job that left `squeue`, from the jobcomp/filetxt log.
    async fn jobcomp_record(&self) -> Option<sl::Completed> {
        let path = self.s.jobcomp.read().unwrap().clone()?;
        let text = tokio::fs::read(&path).await.ok()?;
        sl::parse_jobcomp_of(&String::from_utf8_lossy(&text), self.id, self.task, self.job.owner_uid)
    }

    /// Append new Slurm output to the job's log, cut into lines and capped like any job's output (a
    /// line not ended yet shows as its progress state; at the end it is written as it is). After each
    /// copy the log records where in the output file its next line starts, so a restarted engine
    /// reads on from there. The file is read as root from the user's folder, so it is opened without
    /// following links (see [`sl::read_output`]); a refusal is written to the log once and copying stops.
    async fn copy_output(&mut self, last: bool) {
        let Some(dir) = self.s.settings.log_dir.clone() else {
            return;
        };
        if self.copied == u64::MAX {
            return;
        }
        loop {
            let (job_id, uid, name, from, dir) = (
                self.job.id,
                self.job.owner_uid,
                self.file.clone(),
                self.copied,
                dir.clone(),
            );
            let read = tokio::task::spawn_blocking(move || sl::read_output(&dir, uid, &name, from)).await;
            let data = match read {
                Ok(Ok(d)) => d,
                Ok(Err(err)) if err.kind() == std::io::ErrorKind::NotFound => return,
                Ok(Err(err)) => {
                    append_log(
                        &self.e.log_of(job_id),
                        &format!("the job's output cannot be read safely ({err}); not copied"),
                    );
                    warn!(job = job_id, "not copying Slurm output: {err}");
                    self.copied = u64::MAX;
                    return;
                }
                Err(_) => return,
            };
            let more = data.len() as u64 >= sl::OUTPUT_READ;
            let wrote = (|| {
                if self.log.is_none() {
                    self.log = Some(CappedLog::open(&self.e.log_of(job_id), self.e.policy().log_cap)?);
                }
                let log = self.log.as_mut().expect("opened above");
                let mut ended = false;
                self.lines.feed(&data, |t, cut| {
                    ended = true;
                    log.line(b"", t, cut)
                })?;
                if ended {
                    self.progress.clear();
                }
                if last && !more {
                    if !self.lines.is_empty() {
                        let (t, cut) = self.lines.state();
                        log.line(b"", t, cut)?;
                    }
                    self.lines.clear();
                } else {
                    let state = self.lines.state().0;
                    let state = &state[..state.len().min(crate::engine::joblog::PROGRESS_MAX)];
                    if !state.is_empty() && state != self.progress.as_slice() {
                        log.progress(state)?;
                        self.progress = state.to_vec();
                    }
                }
                if !data.is_empty() {
                    log.mark(&format!(
                        "{} {}",
                        self.file,
                        from + data.len() as u64 - self.lines.pending()
                    ))?;
                }
                Ok::<_, std::io::Error>(())
            })();
            match wrote {
                Ok(()) => self.copied += data.len() as u64,
                Err(err) => {
                    warn!(job = job_id, "cannot write the log of job {job_id}: {err}");
                    return;
                }
            }
            if !more {
                return;
            }
        }
    }
}

#[async_trait::async_trait]
impl Watch for SlurmWatch {
    async fn next(&mut self) -> Option<Seen> {
        loop {
            let snap = self.rx.borrow_and_update().clone();
            if snap.ok && snap.at >= self.since {
                let now = self.e.now();
                let timeout_ms = self.job.timeout_ms;
                // Why Gantry stopped it, also when that was before an engine restart.
                let stop = self.stop.or_else(|| {
                    let timed_out = self.running_since.zip(timeout_ms).is_some_and(|(s, t)| now >= s + t);
                    timed_out.then_some(Stop::Timeout)
                });
                let mut started = None;
                let seen = match sl::find_job(&snap.jobs, self.id, self.task) {
                    Some(j) if sl::requeued(&j.state(), j.restarts(), self.base, self.running_since.is_some()) => {
                        // Requeued: this attempt ended by preemption (Gantry's, whose reason the
                        // attempt carries, or Slurm's own); the job's next attempt follows the same
                        // Slurm job when it runs again.
                        self.copy_output(true).await;
                        self.e.waiting.write().unwrap().remove(&self.job.id);
                        let by = if self.preempting.is_some() {
                            String::new()
                        } else {
                            "Slurm (it requeued the job: the cluster's own preemption, or a node failure)".into()
                        };
                        return Some(Seen::Ended(How::Preempted { code: None, by }));
                    }
                    Some(j) => {
                        self.missing = 0;
                        let seen = match sl::seen(
                            &j.state(),
                            &j.state_reason,
                            j.exit(),
                            self.running_since.is_some(),
                            stop,
                            timeout_ms,
                        ) {
                            // Not started by this attempt yet: a requeued job's last run still
                            // finishing on its node is not this attempt's start.
                            sl::Seen::Running if j.state() == "COMPLETING" && self.running_since.is_none() => {
                                sl::Seen::Pending(format!(
                                    "its last run is finishing on {} (COMPLETING)",
                                    j.nodes.as_deref().unwrap_or("its node")
                                ))
                            }
                            other => other,
                        };
                        // It ran, also when it started and ended between two polls: record when.
                        let ran = match &seen {
                            sl::Seen::Running => true,
                            sl::Seen::Ended(h) => {
                                j.started_at_s().is_some() && matches!(h, How::Exited { .. } | How::TimedOut { .. })
                            }
                            sl::Seen::Pending(_) => false,
                        };
                        if ran && self.running_since.is_none() {
                            let since = j.started_at_s().map(|t| t * 1000).unwrap_or(now);
                            self.running_since = Some(since);
                            self.running(j, since);
                            started = Some(since);
                        }
                        Some(seen)
                    }
                    None => {
                        // Gone from squeue (it ended longer ago than MinJobAge): jobcomp has its end.
                        let done = self.jobcomp_record().await;
                        match done {
                            Some(c) => Some(sl::seen(
                                &c.state,
                                "",
                                c.exit,
                                self.running_since.is_some() || c.started,
                                stop,
                                timeout_ms,
                            )),
                            None => {
                                self.missing += 1;
                                (self.missing >= 3).then(|| {
                                    sl::Seen::Ended(How::Lost(format!(
                                        "Slurm no longer knows job {}, and its end is not in the jobcomp log",
                                        self.shown
                                    )))
                                })
                            }
                        }
                    }
                };
                // Preempting: once it exited on its checkpoint signal, or its grace passed, requeue it
                // (a finished job too: Slurm requeues it while it still knows it), then wait for a
                // snapshot that shows it requeued.
                if let Some((at, false)) = self.preempting {
                    let ended = matches!(seen, Some(sl::Seen::Ended(_)));
                    if ended || now >= at {
                        match self.s.client.requeue(&self.who, &self.shown).await {
                            Ok(()) => {
                                self.preempting = Some((at, true));
                                append_log(
                                    &self.e.log_of(self.job.id),
                                    &format!("requeued Slurm job {} (scontrol requeue)", self.shown),
                                );
                                self.since = self.e.now();
                                self.s.refresh.notify_one();
                                if self.rx.changed().await.is_err() {
                                    return None;
                                }
                                continue;
                            }
                            // It ended and cannot be requeued: its end is recorded (preempted), and the
                            // job's next attempt is a new Slurm job.
                            Err(err) if ended => warn!(
                                job = self.job.id,
                                "scontrol requeue {} failed: {err}; it is submitted again", self.shown
                            ),
                            Err(err) => warn!(
                                job = self.job.id,
                                "scontrol requeue {} failed: {err}; trying again", self.shown
                            ),
                        }
                    }
                }
                match seen {
                    Some(sl::Seen::Pending(why)) => {
                        let mut w = self.e.waiting.write().unwrap();
                        w.insert(
                            self.job.id,
                            Waiting {
                                job_id: self.job.id,
                                position: 0,
                                reason: format!("Slurm job {}: {why}", self.shown),
                                reserved: vec![],
                            },
                        );
                    }
                    Some(sl::Seen::Ended(how)) => {
                        self.copy_output(true).await;
                        let how = sl::oom_from_output(how, &log_tail(&self.e, self.job.id));
                        self.e.waiting.write().unwrap().remove(&self.job.id);
                        return Some(Seen::Ended(how));
                    }
                    Some(sl::Seen::Running) | None => {}
                }
                // Its timeout counts from here; the same snapshot is read again on the next call.
                if let Some(since) = started {
                    return Some(Seen::Running { since });
                }
            }
            if self.running_since.is_some() {
                self.copy_output(false).await;
            }
            if self.rx.changed().await.is_err() {
                return None;
            }
        }
    }

    async fn stop(&mut self, why: Stop) -> bool {
        if why == Stop::Preempt {
            // The checkpoint signal to the batch shell (its trap hands it to the container); `next`
            // requeues the job once it exited or its grace passed.
            let c = self.checkpoint.clone().unwrap_or(sl::Checkpoint {
                signal: "SIGTERM".into(),
                grace: self.e.policy().stop_grace,
            });
            let now = self.e.now();
            let at = match self
                .s
                .client
                .signal(&self.who, &self.shown, sl::slurm_signal(&c.signal))
                .await
            {
                Ok(()) => {
                    append_log(&self.e.log_of(self.job.id), &format!("sent {} to Slurm job {} (scancel --signal --batch); requeued once it exits, at most {} later", c.signal, self.shown, crate::units::duration_ms(c.grace.as_millis() as i64)));
                    now + c.grace.as_millis() as i64
                }
                Err(err) if err.is_transient() => {
                    warn!(
                        job = self.job.id,
                        "scancel --signal {} failed: {err}; trying again", self.shown
                    );
                    return false;
                }
                Err(err) => {
                    warn!(
                        job = self.job.id,
                        "scancel --signal {} failed: {err}; requeued at once", self.shown
                    );
                    now
                }
            };
            self.stop = Some(why);
            self.preempting = Some((at, false));
            self.s.refresh.notify_one();
            return true;
        }
        // A cancel or timeout during a preemption ends the job; it is not requeued.
        self.preempting = None;
        if why == Stop::Timeout {
            append_log(
                &self.e.log_of(self.job.id),
                &format!(
                    "stopping: the {} timeout passed",
                    crate::units::duration_ms(self.job.timeout_ms.unwrap_or(0))
                ),
            );
        }
        let done = match self.s.client.cancel(&self.who, &self.shown).await {
            Ok(()) => {
                self.stop = Some(why);
                true
            }
            Err(err) => {
                warn!(
                    job = self.job.id,
                    "scancel {} as {} failed: {err}; trying again", self.shown, self.job.owner
                );
                false
            }
        };
        self.s.refresh.notify_one();
        done
    }

    async fn detach(&mut self) {}
}

/// The last few KiB of a job's log.
fn log_tail(e: &Engine, job_id: i64) -> Vec<u8> {
    let data = std::fs::read(e.log_of(job_id)).unwrap_or_default();
    data[data.len().saturating_sub(4096)..].to_vec()
}

/// Where to read `file` (this attempt's output) on from: the last place the log recorded for it
/// (`CappedLog::mark`); in a log from before such records, every line that is not Gantry's own.
/// The output file (in the owner's folder of the log dir) of the Slurm job `run`, which attempt `first`
/// of `job` submitted (a task of a job array: the array's file of that task).
pub(super) fn output_file(e: &Engine, job: &Job, run: &RunRef, first: u32) -> String {
    match (run, &job.job.matrix_part) {
        (RunRef::Slurm { task: Some(t), .. }, Some(p)) => format!("{}-arr{}-{t}.out", e.db_uid, p.group),
        _ => submit::output_name(e, job.id, first),
    }
}

fn copied(e: &Engine, job_id: i64, file: &str) -> u64 {
    let data = std::fs::read(e.log_of(job_id)).unwrap_or_default();
    let mut marked = None;
    let mut any = false;
    for l in data.split(|c| *c == b'\n') {
        let Some(m) = l.strip_prefix(b"\r\r") else { continue };
        any = true;
        let m = String::from_utf8_lossy(m);
        if let Some((_, n)) = m.rsplit_once(' ').filter(|(f, _)| *f == file) {
            marked = n.parse().ok().or(marked);
        }
    }
    match (marked, any) {
        (Some(n), _) => n,
        (None, true) => 0,
        (None, false) => data
            .split_inclusive(|c| *c == b'\n')
            .filter(|l| !is_gantrys(l) && !is_progress(l))
            .map(|l| l.len() as u64)
            .sum(),
    }
}
