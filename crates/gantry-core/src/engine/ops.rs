//! The API facade: what clients may ask of the engine.

use std::io::{Seek, SeekFrom, Write};

use crate::access::{self, Cred, Forbidden};
use super::{Engine, EngineError, GpuStatus, JobDetail, QueueEntry};
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

    /// Reject jobs the backend can never run (this machine's GPUs; what Slurm can be asked for).
    pub fn check_fits(&self, job: &ValidJob) -> Result<(), SpecError> {
        self.backend.check_fits(self, job)
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
        let ok = self.store().set_held(id, held, &crate::access::user_name(caller_uid))?;
        self.wake.notify_one();
        Ok(ok)
    }

    /// The GPUs view: the backend's GPUs and who holds each one.
    pub fn gpu_status(&self) -> GpuStatus {
        self.backend.gpu_status(self)
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
