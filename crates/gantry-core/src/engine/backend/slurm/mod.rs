//! The Slurm backend: no local placement. Each queued job is submitted to Slurm as its owner (one
//! attempt = one Slurm job), a tracker reads `squeue --json` every `[slurm] poll`, and each attempt's
//! watcher turns what Slurm says into Gantry's states, "why waiting", log copies and the attempt's
//! end. Slurm is reached through a [`SlurmClient`] (the real commands, or `FakeSlurm` in tests).
//!
//! Submission is idempotent: the attempt row (the intent) is written before `sbatch`, the Slurm job
//! carries the attempt's marker in `--comment`, and its id is recorded after. After a restart an
//! attempt without an id is looked up by its marker among its owner's Slurm jobs before anything is
//! submitted again.

mod gpus;
mod submit;
mod watch;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use tokio::sync::{watch as channel, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::{Backend, Dispatch, Launched, Open, Placed, Resumed, Since, Start, Watch};
use crate::engine::{append_log, Engine, EngineError};
use crate::gpu::{GpuError, GpuSample};
use crate::outcome::How;
use crate::protocol::GpuStatus;
use crate::scheduler::{self, Waiting};
use crate::slurm::{self as sl, As, Node, Resume, Settings, SlurmClient, SqJob};
use crate::spec::{SpecError, ValidJob};
use crate::store::{Attempt, Job, QueuedRow, RunRef};

/// What the last `squeue --json` said about this engine's jobs.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    /// When the `squeue` that produced it began (ms): it shows every job submitted before.
    pub at: i64,
    pub ok: bool,
    pub jobs: HashMap<u64, SqJob>,
}

/// The Slurm backend's shared state (its watchers hold it too).
pub(crate) struct Shared {
    pub client: Arc<dyn SlurmClient>,
    pub settings: Settings,
    pub snapshot: channel::Sender<Arc<Snapshot>>,
    /// Read `squeue` now (after a submit), not at the next poll.
    pub refresh: Notify,
    pub nodes: RwLock<Vec<Node>>,
    pub jobcomp: RwLock<Option<PathBuf>>,
}

pub(crate) struct SlurmBackend {
    s: Arc<Shared>,
}

impl SlurmBackend {
    pub fn new(client: Arc<dyn SlurmClient>, settings: Settings) -> SlurmBackend {
        let (snapshot, _) = channel::channel(Arc::new(Snapshot::default()));
        SlurmBackend {
            s: Arc::new(Shared {
                client,
                settings,
                snapshot,
                refresh: Notify::new(),
                nodes: RwLock::new(vec![]),
                jobcomp: RwLock::new(None),
            }),
        }
    }
}

/// Who a job's Slurm commands run as: its owner.
fn owner(job: &Job) -> As {
    As {
        name: job.owner.clone(),
        uid: job.owner_uid,
    }
}

/// Read `squeue --json` every poll (or when asked) and publish this engine's jobs; a Slurm that does
/// not answer is the backend's problem (`gantry status`, the app's banner).
async fn tracker(e: Arc<Engine>, s: Arc<Shared>) {
    let jobcomp = match s.settings.jobcomp_log.clone() {
        Some(p) => Some(p),
        None => s.client.jobcomp_log().await,
    };
    *s.jobcomp.write().unwrap() = jobcomp;
    let prefix = format!("gantry:{}:", e.db_uid);
    let mut n: u64 = 0;
    loop {
        let at = e.now();
        match s.client.queue().await {
            Ok(jobs) => {
                let jobs = jobs
                    .into_iter()
                    .filter(|j| j.comment.as_deref().is_some_and(|c| c.starts_with(&prefix)))
                    .map(|j| (j.job_id, j))
                    .collect();
                s.snapshot.send_replace(Arc::new(Snapshot { at, ok: true, jobs }));
                let mut h = e.health.write().unwrap();
                if h.backend_problem.take().is_some() {
                    info!("Slurm answers again");
                }
            }
            Err(err) => {
                let msg = err.to_string();
                let mut h = e.health.write().unwrap();
                if h.backend_problem.as_deref() != Some(&msg) {
                    warn!("{msg}");
                }
                h.backend_problem = Some(msg);
            }
        }
        if n.is_multiple_of(5) {
            match s.client.nodes().await {
                Ok(nodes) => *s.nodes.write().unwrap() = nodes,
                Err(err) => warn!("cannot list Slurm's nodes: {err}"),
            }
        }
        n += 1;
        tokio::select! {
            _ = tokio::time::sleep(s.settings.poll) => {}
            _ = s.refresh.notified() => {}
            _ = e.shutdown.cancelled() => return,
        }
    }
}

impl SlurmBackend {
    /// Gantry's own preemptions on Slurm, each pass: this engine's jobs whose Slurm jobs pend for
    /// resources against its running preemptible ones, by the priority rule
    /// ([`scheduler::preempt_pending`]); carried out like the workstation's (recorded on the
    /// attempt first, then its supervisor stops it: checkpoint signal, grace, `scontrol requeue`).
    fn preempt_for_pending(&self, e: &Arc<Engine>) {
        let Some(rules) = e.policy().preemption.rules() else {
            return;
        };
        if e.health.read().unwrap().store_problem.is_some() {
            return;
        }
        let snap = self.s.snapshot.borrow().clone();
        if !snap.ok {
            return;
        }
        let mut waiting = vec![];
        let mut running = vec![];
        for (id, h) in e.running.lock().unwrap().iter() {
            let Some(RunRef::Slurm { id: sid, task }) = &h.run else {
                continue;
            };
            let Some(j) = sl::find_job(&snap.jobs, *sid, *task) else {
                continue;
            };
            match j.state().as_str() {
                "PENDING" if matches!(j.state_reason.as_str(), "Resources" | "Priority") => waiting.push(*id),
                "RUNNING" if h.victim.is_some() => running.push(scheduler::RunningJob {
                    job_id: *id,
                    user: h.owner.clone(),
                    gpus: h.gpus.clone(),
                    gpu_memory: None,
                    expected_end_ms: None,
                    needs: Default::default(),
                    victim: h.victim.clone(),
                    declared: None,
                }),
                _ => {}
            }
        }
        if waiting.is_empty() || running.is_empty() {
            return;
        }
        let mut pending = vec![];
        for id in waiting {
            match e.reader().job(id) {
                Ok(Some(j)) => pending.push(scheduler::PendingJob {
                    job_id: j.id,
                    user: j.owner.clone(),
                    priority: j.priority,
                    gpus: j.gpus,
                }),
                Ok(None) => {}
                Err(err) => {
                    warn!("cannot read job {id} to decide preemptions: {err}");
                    return;
                }
            }
        }
        let decisions = scheduler::preempt_pending(e.now(), &rules, &pending, &running);
        if !decisions.is_empty() {
            e.preempt(decisions);
        }
        // GPUs kept for a preempting job are the workstation's; Slurm places by itself.
        e.claims.lock().unwrap().clear();
    }
}

#[async_trait::async_trait]
impl Backend for SlurmBackend {
    fn name(&self) -> &'static str {
        "Slurm"
    }

    async fn start(&self, e: &Arc<Engine>) -> Vec<JoinHandle<()>> {
        info!(
            "backend: Slurm (partition {}), squeue every {:?}",
            self.s.settings.partition.as_deref().unwrap_or("default"),
            self.s.settings.poll
        );
        vec![tokio::spawn(tracker(e.clone(), self.s.clone()))]
    }

    /// Follow every attempt whose Slurm id is recorded; look for the others by their marker
    /// ([`Backend::find`]), so nothing is submitted twice.
    async fn reconcile(&self, _e: &Arc<Engine>, open: &[Open<'_>]) -> Result<Vec<(i64, Resumed)>, EngineError> {
        let mut out = vec![];
        for o in open.iter().filter(|o| !o.monitored) {
            let run = o.attempt.run_ref();
            let recorded = match &run {
                Some(RunRef::Slurm { id, .. }) => Some(*id),
                _ => None,
            };
            let action = match (sl::resume(recorded, &[]), run) {
                (Resume::Follow(id), Some(run)) => {
                    info!(job = o.job.id, slurm = id, "following Slurm job again");
                    Resumed::Follow(run)
                }
                _ => Resumed::Find,
            };
            out.push((o.job.id, action));
        }
        Ok(out)
    }

    async fn find(&self, e: &Arc<Engine>, job: &Job, attempt: &Attempt) -> Option<Resumed> {
        let mut task = attempt.slurm_array_task;
        let marker = sl::marker(&e.db_uid, job.id, attempt.n);
        // A matrix's first attempts may have gone as one array: its tasks carry the array's marker.
        let array = job
            .job
            .matrix_part
            .as_ref()
            .filter(|_| attempt.n == 1)
            .map(|p| (sl::array_marker(&e.db_uid, &p.group), p.index));
        let found = loop {
            match self.s.client.queue().await {
                Ok(jobs) => {
                    // Only the owner's jobs: anyone may put any comment on their own Slurm jobs.
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
                Err(err) => {
                    warn!(job = job.id, "cannot look for job {} in Slurm yet: {err}", job.id);
                    tokio::select! {
                        _ = tokio::time::sleep(self.s.settings.poll) => {}
                        _ = e.shutdown.cancelled() => return None,
                    }
                }
            }
        };
        match sl::resume(None, &found) {
            Resume::Follow(id) | Resume::Adopt(id) => {
                info!(
                    job = job.id,
                    slurm = id,
                    "found in Slurm by its marker after a restart: not submitted again"
                );
                let run = RunRef::Slurm { id, task };
                if !submit::record_run(e, job.id, attempt, &run).await {
                    return None;
                }
                append_log(
                    &e.log_of(job.id),
                    &format!("found as Slurm job {run} after an engine restart (not submitted again)"),
                );
                Some(Resumed::Follow(run))
            }
            Resume::NeverSubmitted => Some(Resumed::End {
                how: if job.cancel_requested {
                    How::CancelledBeforeStart
                } else {
                    How::NeverStarted
                },
                run: None,
            }),
        }
    }

    /// Every queued job that may start is submitted (Slurm decides where and when). A `matrix` whose
    /// jobs are all ready together (same dependencies, first attempts) goes to Slurm as one job array;
    /// otherwise (one was held, cancelled or is retrying) one by one.
    async fn place(&self, e: &Arc<Engine>) -> Vec<Dispatch> {
        self.preempt_for_pending(e);
        let queued: Vec<Arc<QueuedRow>> = e.queue.lock().unwrap().rows();
        let now = e.now();
        let problem = e.health.read().unwrap().store_problem.clone();
        let mut blocked: Vec<(i64, String)> = vec![];
        let mut ready: Vec<(Arc<QueuedRow>, Vec<RunRef>)> = vec![];
        for j in queued {
            if j.held {
                blocked.push((j.id, format!("held by its owner (`gantry release {}`)", j.id)));
            } else if let Some(nb) = j.not_before.filter(|nb| *nb > now) {
                blocked.push((j.id, format!("retrying in {}", crate::units::duration_ms(nb - now))));
            } else if let Some(p) = &problem {
                blocked.push((j.id, p.clone()));
            } else {
                match submit::after(e, &j) {
                    Ok(after) => ready.push((j, after)),
                    Err(why) => blocked.push((j.id, why)),
                }
            }
        }
        {
            let running = e.running.lock().unwrap();
            let mut w = e.waiting.write().unwrap();
            w.retain(|id, _| running.contains_key(id));
            for (i, (id, reason)) in blocked.into_iter().enumerate() {
                w.insert(
                    id,
                    Waiting {
                        job_id: id,
                        position: i + 1,
                        reason,
                        reserved: vec![],
                    },
                );
            }
        }
        let start = |job: Job, after: Vec<RunRef>, note: &str| Start {
            job,
            gpus: vec![],
            gpu_uuids: vec![],
            note: Some(note.into()),
            runtime: None,
            placed: Placed {
                after,
                ..Default::default()
            },
        };
        let mut singles: Vec<(Job, Vec<RunRef>)> = vec![];
        let mut groups: HashMap<String, Vec<(Job, Vec<RunRef>)>> = HashMap::new();
        for (row, after) in ready {
            let job = match e.store().job(row.id) {
                Ok(Some(j)) => j,
                Ok(None) => continue,
                Err(err) => {
                    error!("cannot read job {}: {err}", row.id);
                    return vec![];
                }
            };
            match job.job.matrix_part.clone() {
                Some(p) if job.attempts == 0 && p.count >= 2 => groups.entry(p.group).or_default().push((job, after)),
                _ => singles.push((job, after)),
            }
        }
        let mut out = vec![];
        for (_, mut g) in groups {
            let count = g[0].0.job.matrix_part.as_ref().map(|p| p.count as usize).unwrap_or(0);
            if g.len() == count && g.iter().all(|(_, a)| *a == g[0].1) {
                g.sort_by_key(|(j, _)| j.job.matrix_part.as_ref().map(|p| p.index));
                out.push(Dispatch::Together(
                    g.into_iter()
                        .map(|(j, a)| start(j, a, "submitting to Slurm with its matrix as one job array"))
                        .collect(),
                ));
            } else if g.iter().all(|(j, _)| now - j.submitted_at < 3_000) {
                continue; // its siblings may still be arriving: next pass
            } else {
                singles.extend(g);
            }
        }
        out.extend(
            singles
                .into_iter()
                .map(|(j, a)| Dispatch::One(start(j, a, "submitting to Slurm"))),
        );
        out
    }

    async fn launch(
        &self,
        e: &Arc<Engine>,
        job: &Job,
        attempt: &Attempt,
        placed: &Placed,
        cancel: &CancellationToken,
    ) -> Launched {
        submit::launch_one(e, &self.s, job, attempt, placed, cancel).await
    }

    async fn launch_together(
        &self,
        e: &Arc<Engine>,
        parts: &[(Job, Attempt, CancellationToken)],
        placed: &Placed,
    ) -> Vec<Launched> {
        submit::launch_array(e, &self.s, parts, placed).await
    }

    fn metrics_file(&self, e: &Engine, job: &Job, attempt: &Attempt, run: &RunRef) -> Option<std::path::PathBuf> {
        // Beside its output in the owner's folder of the shared log dir (none without one: the
        // output and the file stay on the node). A Slurm requeue runs the script again: a new file.
        let dir = self.s.settings.log_dir.as_ref()?.join(job.owner_uid.to_string());
        let (base, first) = submit::followed(e, job.id, attempt, run);
        Some(dir.join(submit::metrics_name(&watch::output_file(e, job, run, first), base)))
    }

    fn watch(&self, e: &Arc<Engine>, job: &Job, attempt: &Attempt, run: &RunRef, since: Since) -> Box<dyn Watch> {
        Box::new(watch::SlurmWatch::new(
            e.clone(),
            self.s.clone(),
            job,
            attempt,
            run,
            since,
        ))
    }

    async fn abort(&self, _e: &Engine, job: &Job, run: &RunRef) {
        if let Err(err) = self.s.client.cancel(&owner(job), &run.to_string()).await {
            warn!(
                job = job.id,
                "could not scancel Slurm job {run} of a crashed supervisor: {err}"
            );
        }
        self.s.refresh.notify_one();
    }

    async fn release(&self, _e: &Engine, _job_id: i64, _attempt: &Attempt, _run: Option<&RunRef>) {
        // Slurm removes what a job leaves; its output file stays where the user can read it.
    }

    fn sample(&self, e: &Engine) -> Result<Vec<GpuSample>, GpuError> {
        Ok(gpus::cluster_gpus(e, &self.s).0)
    }

    fn gpu_status(&self, e: &Engine) -> GpuStatus {
        let (gpus, holders, users) = gpus::cluster_gpus(e, &self.s);
        let note = Some(format!(
            "Slurm cluster: {} GPUs on its nodes (scontrol show node); allocated ones are listed as in use",
            gpus.len()
        ));
        GpuStatus {
            backend: e.backend_kind,
            note,
            gpus,
            holders,
            users,
            library: None,
            reserved: vec![],
        }
    }

    /// Slurm knows the cluster; what it cannot do at all is refused now, with the reason.
    fn check_fits(&self, e: &Engine, job: &ValidJob) -> Result<(), SpecError> {
        let sub = sl::Submission {
            job,
            marker: String::new(),
            uid: 0,
            gid: 0,
            home: "/".into(),
            output: "/".into(),
            priority_range: e.policy().user_priority,
            after: vec![],
            mounts: vec![],
            metrics: None,
            preempt: None,
            restarts: 0,
        };
        sl::sbatch_args(&sub, &self.s.settings).map(|_| ()).map_err(|r| {
            SpecError::new(
                r.0,
                "see the guide's \"From one workstation to a cluster\" (docs/book/src/admin-slurm.md)",
            )
        })
    }

    fn left_running(&self) -> &'static str {
        "Slurm jobs keep running and are followed again on next start"
    }
}

#[cfg(test)]
mod tests;
