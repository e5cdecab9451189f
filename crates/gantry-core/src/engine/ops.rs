//! The API facade: what clients may ask of the engine.

use std::collections::HashMap;
use std::io::{Seek, SeekFrom, Write};

use crate::access::{self, Cred, Forbidden};
use super::{Engine, EngineError, GpuStatus, GpuUser, JobDetail, QueueEntry};
use crate::spec::{self, SpecError, ValidJob};
use crate::store::{HistoryFilter, HistoryRow, Job, JobState, Owner, TimelineRun};

impl Engine {
    /// Users who ran `gantry inbox init` (the system engine watches their drop folders).
    pub(crate) fn registered_inboxes(&self) -> Result<Vec<u32>, EngineError> {
        Ok(self.reader().user_inboxes()?)
    }

    pub(crate) fn register_inbox(&self, uid: u32) -> Result<(), EngineError> {
        Ok(self.store().add_user_inbox(uid)?)
    }

    pub fn history_count(&self, f: &HistoryFilter) -> Result<i64, EngineError> {
        Ok(self.reader().history_count(f)?)
    }

    pub fn timeline(&self, from: i64, to: i64) -> Result<Vec<TimelineRun>, EngineError> {
        Ok(self.reader().timeline(from, to)?)
    }

    pub fn gpu_minutes(&self, gpu: u32, from: i64, to: i64) -> Result<Vec<(i64, f64, i64)>, EngineError> {
        Ok(self.reader().gpu_minutes(gpu, from)?.into_iter().filter(|m| m.0 < to).collect())
    }

    /// " (limits.x in FILE)": where a lab limit comes from, for error messages.
    pub(super) fn set_in(&self, key: &str) -> String {
        match self.lab_file() {
            Some(f) => format!(" ({key} in {})", f.display()),
            None => String::new(),
        }
    }

    /// The lab config file the policy comes from (`None`: the built-in defaults).
    pub fn lab_file(&self) -> Option<&std::path::Path> {
        self.cfg.lab_file.as_deref().filter(|f| f.exists())
    }

    /// Keep the highest job id handed out outside the database too (fixed width, rewritten in place, so
    /// it needs no new disk blocks): ids never restart even if the database loses its WAL.
    pub(super) fn mark_job_id(&self, id: i64) -> Result<(), EngineError> {
        let mut f = self.id_mark.lock().unwrap();
        f.seek(SeekFrom::Start(0))?;
        f.write_all(format!("{id:>20}\n").as_bytes())?;
        Ok(())
    }

    /// Reject jobs this machine can never run.
    pub fn check_fits(&self, job: &ValidJob) -> Result<(), SpecError> {
        if let Some(s) = &self.slurm {
            // Slurm knows the cluster; what it cannot do at all is refused now, with the reason.
            let sub = crate::slurm::Submission {
                job,
                marker: String::new(),
                uid: 0,
                gid: 0,
                home: "/".into(),
                output: "/".into(),
                priority_range: self.policy().user_priority,
                after: vec![],
                mounts: vec![],
            };
            return crate::slurm::sbatch_args(&sub, &s.settings).map(|_| ()).map_err(|r| SpecError::new(r.0, "see the README's \"From one workstation to a cluster\""));
        }
        let gpus: Vec<crate::gpu::GpuSample> = self.latest.read().unwrap().iter().filter(|g| self.usable(g)).cloned().collect();
        let filter = job.gpu_filter();
        if job.gpus > 0 && !filter.is_any() {
            let fit = gpus.iter().filter(|g| filter.eligible(&g.name, g.memory_total)).count();
            if fit < job.gpus as usize {
                let listed = gpus.iter().map(|g| format!("GPU {} {} ({})", g.index, g.name, spec::format_bytes(g.memory_total))).collect::<Vec<_>>().join("; ");
                return Err(SpecError::new(
                    format!("the job asks for {}, this machine has {fit} such GPU{} for Gantry jobs: {listed}", filter.describe(job.gpus), if fit == 1 { "" } else { "s" }),
                    "change `gpu_type` (part of a name above, any case) or `min_gpu_memory`, or ask for fewer GPUs",
                ));
            }
        }
        if job.gpus as usize > gpus.len() {
            let kept = self.reserved_gpus();
            let why = if kept.is_empty() { String::new() } else { format!(" (GPU {} kept for interactive use{})", kept.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","), self.set_in("gpus")) };
            return Err(SpecError::new(
                format!("the job asks for {} GPUs, this machine has {} for Gantry jobs{why}", job.gpus, gpus.len()),
                format!("ask for at most {} GPUs", gpus.len()),
            ));
        }
        if let Some(m) = job.gpu_memory {
            let max = gpus.iter().map(|g| g.memory_total).max().unwrap_or(0);
            if m > max {
                return Err(SpecError::new(
                    format!("the job asks for {} per GPU, the largest GPU here has {}", spec::format_bytes(m), spec::format_bytes(max)),
                    "lower `gpu_memory`, or leave it out to get whole GPUs",
                ));
            }
        }
        Ok(())
    }

    /// Check a job's mounts with its owner's permissions (all but `skip`, a path that exists only once
    /// the job is queued: a template's config file).
    pub fn check_mounts(&self, job: &ValidJob, owner: &Owner, skip: Option<&str>) -> Result<(), EngineError> {
        let mounts: Vec<spec::Mount> = job.mounts.iter().filter(|m| Some(m.host.as_str()) != skip).cloned().collect();
        access::check_mounts(&Cred::of_user(owner.uid, owner.gid), &mounts, job.spec.workdir.as_deref(), &self.forbidden())?;
        Ok(())
    }

    /// What no job may mount: the container engine's sockets and this engine's state.
    pub(super) fn forbidden(&self) -> Forbidden {
        Forbidden::for_engine(&self.cfg.paths.state_dir, &self.cfg.paths.socket(), &self.cfg.paths.inbox)
    }

    pub fn source_known(&self, key: &str) -> Option<i64> {
        self.store().job_by_source_key(key).ok().flatten()
    }

    pub fn queue(&self) -> Result<Vec<QueueEntry>, EngineError> {
        let jobs = self.reader().active_jobs()?;
        let waiting = self.waiting.read().unwrap();
        let eta = self.eta.read().unwrap();
        let running = self.running.lock().unwrap();
        let problem = self.health.read().unwrap().store_problem.clone();
        Ok(jobs
            .into_iter()
            .map(|j| {
                let w = waiting.get(&j.id);
                QueueEntry {
                    gpus_assigned: running.get(&j.id).map(|h| h.gpus.clone()).unwrap_or_default(),
                    position: w.map(|w| w.position),
                    reason: match (j.state, w) {
                        (JobState::Queued, _) if problem.is_some() => problem.clone(),
                        (JobState::Queued, Some(w)) => Some(w.why()),
                        (JobState::Queued, None) => Some("about to be scheduled".into()),
                        // The Slurm backend: submitted, waiting in Slurm's queue (Slurm's reason).
                        (JobState::Starting, Some(w)) => Some(w.reason.clone()),
                        _ => None,
                    },
                    estimated_start: if j.state == JobState::Queued { eta.get(&j.id).copied() } else { None },
                    eta_confidence: (j.state == JobState::Queued && eta.contains_key(&j.id)).then(|| "p50".to_string()),
                    job: j,
                }
            })
            .collect())
    }

    pub fn job_detail(&self, id: i64) -> Result<JobDetail, EngineError> {
        let st = self.reader();
        let job = st.job(id)?.ok_or(EngineError::NoSuchJob(id))?;
        let reason = self.waiting.read().unwrap().get(&id).map(|w| w.why());
        Ok(JobDetail { attempts: st.attempts(id)?, events: st.events(id)?, job, reason })
    }

    /// The job, if `caller_uid` may change it: its owner or an admin.
    pub(crate) fn owned(&self, id: i64, caller_uid: u32) -> Result<Job, EngineError> {
        let job = self.store().job(id)?.ok_or(EngineError::NoSuchJob(id))?;
        if caller_uid != job.owner_uid && !self.policy().is_admin(caller_uid) {
            return Err(EngineError::NotOwner { job: id, owner: job.owner });
        }
        Ok(job)
    }

    /// Cancel: queued jobs end at once; running ones get SIGTERM, then SIGKILL after the grace period.
    pub fn cancel(&self, id: i64, caller_uid: u32) -> Result<JobState, EngineError> {
        self.owned(id, caller_uid)?;
        let before = self.store().request_cancel(id)?.ok_or(EngineError::NoSuchJob(id))?;
        match before {
            JobState::Queued => self.notify_job(id, JobState::Cancelled),
            JobState::Starting | JobState::Running => {
                if let Some(h) = self.running.lock().unwrap().get(&id) {
                    h.cancel.cancel();
                }
            }
            _ => {}
        }
        self.wake.notify_one();
        Ok(before)
    }

    pub fn set_priority(&self, id: i64, priority: i32, caller_uid: u32) -> Result<bool, EngineError> {
        self.owned(id, caller_uid)?;
        let policy = self.policy();
        let (lo, hi) = policy.priority_range(caller_uid);
        if !(lo..=hi).contains(&priority) {
            let key = if policy.is_admin(caller_uid) { "limits.admin_priority" } else { "limits.priority" };
            return Err(EngineError::Refused(format!("priority {priority} is outside the range you may use ({lo}..{hi}){}; pick a value from {lo} to {hi}", self.set_in(key))));
        }
        let ok = self.store().set_priority(id, priority)?;
        self.wake.notify_one();
        Ok(ok)
    }

    /// Hold (`held`) or release a queued job. Returns false when the job is not queued (or already
    /// in that state).
    pub fn hold(&self, id: i64, held: bool, caller_uid: u32) -> Result<bool, EngineError> {
        self.owned(id, caller_uid)?;
        let ok = self.store().set_held(id, held, &crate::inbox::user_name(caller_uid))?;
        self.wake.notify_one();
        Ok(ok)
    }

    pub fn gpu_status(&self) -> GpuStatus {
        // (job, GPUs, container) of every running job: a snapshot, so no lock is held across the store.
        let running: Vec<(i64, Vec<u32>, Option<String>)> =
            self.running.lock().unwrap().iter().map(|(id, h)| (*id, h.gpus.clone(), h.container_id.clone())).collect();
        let mut holders: HashMap<u32, Vec<i64>> = HashMap::new();
        for (id, gpus, _) in &running {
            for g in gpus {
                holders.entry(*g).or_default().push(*id);
            }
        }
        let mut holders: Vec<(u32, Vec<i64>)> = holders.into_iter().map(|(g, mut v)| { v.sort(); (g, v) }).collect();
        holders.sort();
        if self.slurm.is_some() {
            let (gpus, holders, users) = self.slurm_gpus();
            let note = Some(format!("Slurm cluster: {} GPUs on its nodes (scontrol show node); allocated ones are listed as in use", gpus.len()));
            return GpuStatus { backend: self.backend_kind, note, gpus, holders, users, library: None, reserved: vec![] };
        }
        let gpus = self.latest.read().unwrap().clone();
        let users = self.gpu_users(&gpus, &running);
        GpuStatus { backend: self.backend_kind, note: self.backend_note.clone(), gpus, holders, users, library: self.backend_library.clone(), reserved: self.reserved_gpus() }
    }

    /// Who is on each GPU: this engine's jobs (by their containers), then every other process, then
    /// containers outside this engine that hold a GPU but run nothing on it yet.
    fn gpu_users(&self, gpus: &[crate::gpu::GpuSample], running: &[(i64, Vec<u32>, Option<String>)]) -> Vec<GpuUser> {
        // Names of containers outside this engine: other engines' jobs, `docker run --gpus`, orphans.
        let mut names: HashMap<String, String> = self.foreign.read().unwrap().iter().map(|f| (f.container_id.clone(), f.name.clone())).collect();
        names.extend(self.health.read().unwrap().orphans.iter().map(|o| (o.container_id.clone(), o.name.clone())));
        let foreign = self.foreign.read().unwrap().clone();
        let mut jobs: HashMap<i64, Option<Job>> = HashMap::new();
        let mut out = vec![];
        for g in gpus {
            for (id, _, cid) in running.iter().filter(|(_, on, _)| on.contains(&g.index)) {
                let job = jobs.entry(*id).or_insert_with(|| self.reader().job(*id).ok().flatten());
                let mine: Vec<_> = g.processes.iter().filter(|p| p.container_id.is_some() && p.container_id == *cid).collect();
                // Known only when NVML lists the job's processes, each with its memory.
                let used_memory = if mine.is_empty() { None } else { mine.iter().try_fold(0, |acc, p| p.used_memory.map(|m| acc + m)) };
                out.push(GpuUser {
                    gpu: g.index,
                    job_id: Some(*id),
                    job_name: job.as_ref().map(|j| j.name.clone()),
                    user: job.as_ref().map(|j| j.owner.clone()),
                    pid: None,
                    command: None,
                    container: None,
                    used_memory,
                    since: job.as_ref().and_then(|j| j.started_at),
                });
            }
            let ours = |c: &Option<String>| c.is_some() && running.iter().any(|(_, _, r)| r == c);
            for p in g.processes.iter().filter(|p| !ours(&p.container_id)) {
                out.push(GpuUser {
                    gpu: g.index,
                    job_id: None,
                    job_name: None,
                    user: p.uid.map(crate::inbox::user_name),
                    pid: Some(p.pid),
                    command: p.command.clone(),
                    container: p.container_id.as_ref().map(|c| names.get(c).cloned().unwrap_or_else(|| c[..12.min(c.len())].to_string())),
                    used_memory: p.used_memory,
                    since: None,
                });
            }
            for f in foreign.iter().filter(|f| super::sampler::held_by(&f.gpus, g)) {
                if !g.processes.iter().any(|p| p.container_id.as_deref() == Some(f.container_id.as_str())) {
                    out.push(GpuUser { gpu: g.index, job_id: None, job_name: None, user: None, pid: None, command: None, container: Some(f.name.clone()), used_memory: None, since: None });
                }
            }
        }
        out
    }

    /// May Gantry jobs use this GPU (lab config `gpus`; a MIG instance also when its physical GPU is
    /// listed)?
    pub(super) fn usable(&self, g: &crate::gpu::GpuSample) -> bool {
        self.usable.as_ref().is_none_or(|u| u.contains(&g.index) || g.mig_parent.as_ref().is_some_and(|p| u.contains(&p.index)))
    }

    /// GPUs the lab config keeps for interactive use.
    pub fn reserved_gpus(&self) -> Vec<u32> {
        self.latest.read().unwrap().iter().filter(|g| !self.usable(g)).map(|g| g.index).collect()
    }

    pub fn history(&self, f: &HistoryFilter) -> Result<Vec<HistoryRow>, EngineError> {
        Ok(self.reader().history(f)?)
    }
}
