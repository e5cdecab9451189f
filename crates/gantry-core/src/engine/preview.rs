//! Dry runs (`gantry submit --dry-run`, `gantry run --dry-run`, the MCP `preview_submit` tool, the
//! app's Submit preview): a submission checked exactly as [`Engine::submit`] checks it, as its
//! submitter, then planned against the last pass's state with its jobs added, so it says where and
//! when they would start. Nothing is queued, written or woken.

use std::path::PathBuf;

use super::pass::JobInputs;
use super::submit::format_of;
use super::{Engine, EngineError};
use crate::policy::Policy;
use crate::protocol::{PreviewJob, SubmitPreview};
use crate::scheduler;
use crate::spec::{self, Origin, ValidJob};
use crate::store::{Owner, QueuedRow};
use crate::units::{duration_setting, format_bytes, local_datetime};

impl Engine {
    /// A dry run of a spec file's submit by `owner`: its error is the one the submit would answer.
    pub fn preview(
        &self,
        text: &str,
        file_name: &str,
        base_dir: Option<PathBuf>,
        begin: Option<&str>,
        owner: &Owner,
    ) -> Result<SubmitPreview, EngineError> {
        let job = spec::validate_text(
            text,
            format_of(file_name)?,
            &Origin {
                file_name: Some(file_name.into()),
                base_dir,
            },
        )?;
        let job = super::submit::with_begin(job, begin)?;
        self.check_mounts(&job, owner, None)?;
        let policy = self.policy();
        let jobs = self.checked_jobs(&job, owner, &policy)?;
        self.check_queued_cap(&self.reader(), jobs.len(), owner, &policy)?;
        let checks = self.checks_met(&job, &jobs, owner, &policy)?;
        let planned = self.plan_preview(&jobs, owner, &policy);
        let jobs = jobs
            .into_iter()
            .zip(planned)
            .map(|(job, (gpus, reason, estimated_start))| PreviewJob {
                starts_now: reason.is_none(),
                gpus,
                reason,
                estimated_start,
                job,
            })
            .collect();
        Ok(SubmitPreview { jobs, checks })
    }

    /// The lab's limits a submission meets, in words.
    fn checks_met(
        &self,
        spec_job: &ValidJob,
        jobs: &[ValidJob],
        owner: &Owner,
        policy: &Policy,
    ) -> Result<Vec<String>, EngineError> {
        let Some(first) = jobs.first() else { return Ok(vec![]) };
        let mut out = vec![];
        let (lo, hi) = policy.priority_range(owner.uid);
        out.push(format!(
            "priority {} is within your range {lo}..{hi}",
            first.spec.priority
        ));
        let shape = match first.gpu_memory {
            Some(m) => format!("{} GPU(s) with {} each", first.gpus, format_bytes(m)),
            None => format!("{} whole GPU(s)", first.gpus),
        };
        out.push(format!("{shape}: this machine has GPUs that can run it"));
        if let Some(cap) = policy.max_running_gpus {
            out.push(format!("{} GPU(s) is within the lab's {cap} GPUs per user", first.gpus));
        }
        match (first.timeout, spec_job.timeout, policy.max_timeout) {
            (Some(t), None, _) => out.push(format!("timeout: the lab's default, {}", duration_setting(t))),
            (Some(t), Some(_), Some(max)) => out.push(format!(
                "timeout {} is within the lab's {}",
                duration_setting(t),
                duration_setting(max)
            )),
            (Some(t), Some(_), None) => out.push(format!("timeout {}", duration_setting(t))),
            (None, ..) => out.push("no timeout (the lab sets none)".into()),
        }
        if !first.mounts.is_empty() {
            out.push(format!(
                "{} mount(s) checked as {}: each exists and you may use it so",
                first.mounts.len(),
                owner.name
            ));
        }
        if !first.spec.is_host_image() {
            out.push(format!("image {} is one the lab allows", first.spec.image));
        }
        if let Some(b) = first.begin_ms {
            out.push(format!(
                "begin {} is within the lab's {} ahead",
                local_datetime(b),
                duration_setting(policy.max_begin)
            ));
        }
        if policy.is_admin(owner.uid) {
            out.push("queued jobs: no limit for admins".into());
        } else {
            let queued = self.reader().queued_count(owner.uid)?;
            out.push(format!(
                "queued jobs: you have {queued}; {} more is within the lab's {}",
                jobs.len(),
                policy.max_queued_per_user
            ));
        }
        Ok(out)
    }

    /// For each job: the GPUs it would get now, or why it would wait, and its estimated start: the
    /// queue and running jobs as they are, on the GPUs as the last pass saw them, with these jobs
    /// added, planned once (pure; nothing is claimed). Held jobs and jobs waiting for others are
    /// left out, as a pass leaves them out.
    fn plan_preview(&self, jobs: &[ValidJob], owner: &Owner, policy: &Policy) -> Vec<Planned> {
        let gpus = self.last_gpus.read().unwrap().clone();
        let Some(gpus) = gpus else {
            let why = if self.backend.name() == "Slurm" {
                "this engine runs jobs through Slurm: Slurm decides where and when it starts"
            } else {
                "the engine has not looked at its GPUs yet (it just started); try again in a few seconds"
            };
            return jobs.iter().map(|_| (vec![], Some(why.to_string()), None)).collect();
        };
        let now = self.now();
        let (usage, history, overruns, typical_wait, shapes) = {
            let s = self.stats.lock().unwrap();
            (
                s.usage.clone(),
                s.history.clone(),
                s.overruns.clone(),
                s.typical_wait,
                s.shapes.clone(),
            )
        };
        let host = self.host_capacity(policy);
        let inputs = JobInputs {
            policy,
            host,
            gpu_count: gpus.len(),
            usage: &usage,
            history: &history,
            overruns: &overruns,
        };
        let rows = self.queue.lock().unwrap().rows();
        let mut queued: Vec<_> = rows
            .iter()
            .filter(|r| !r.held && r.after.is_empty())
            .map(|r| self.scheduled(r, &inputs))
            .collect();
        let mut state = scheduler::State {
            now_ms: now,
            gpus,
            running: self.running_jobs(now),
            queued: vec![],
            config: scheduler::Config {
                reserve_after_ms: policy.reserve_after.as_millis() as i64,
                overrun_margin_ms: policy.overrun_margin.as_millis() as i64,
                max_running_gpus_per_user: policy.max_running_gpus,
                gpu_share: Some(policy.containers.needs(1, None, None, host, inputs.gpu_count)),
                preemption: policy.preemption.rules(),
                shapes,
                bookings: self.booking_holds(now),
                ..self.cfg.scheduler.clone()
            },
            typical_wait_ms: typical_wait,
            host: Some(host),
        };
        // Ids no real job has: after every queued job, in the order they would be queued.
        let ids: Vec<i64> = (0..jobs.len() as i64)
            .map(|i| i64::MAX - jobs.len() as i64 + i)
            .collect();
        for (j, id) in jobs.iter().zip(&ids) {
            let row = preview_row(j, *id, owner, now);
            queued.push(self.scheduled(&row, &inputs));
        }
        state.queued = queued;
        let plan = scheduler::plan(&state);
        let eta = if state.queued.len() <= crate::config::ETA_MAX_QUEUE {
            scheduler::estimate_starts(&state, 3_600_000, crate::config::ETA_MAX_QUEUE)
        } else {
            Default::default()
        };
        jobs.iter()
            .zip(&ids)
            .map(|(j, id)| {
                if let Some(p) = plan.placements.iter().find(|p| p.job_id == *id) {
                    return (p.gpus.clone(), None, Some(now));
                }
                let reason = match (j.begin_ms.filter(|b| *b > now), self.unmet_dependency(j)) {
                    (_, Some(why)) => why,
                    (Some(b), None) => super::pass::starts_at(b, now),
                    (None, None) => plan
                        .waiting
                        .iter()
                        .find(|w| w.job_id == *id)
                        .map(|w| w.why())
                        .unwrap_or_else(|| "it would wait for GPUs".into()),
                };
                (vec![], Some(reason), eta.get(id).copied())
            })
            .collect()
    }
}

impl Engine {
    /// Why a job with `after` would wait: its first dependency that has not succeeded.
    fn unmet_dependency(&self, j: &ValidJob) -> Option<String> {
        use crate::store::JobState;
        j.spec.after.iter().find_map(|a| {
            let spec::IdOrName::Id(d) = a else { return None };
            match self.reader().state_of(*d).ok().flatten() {
                Some(JobState::Succeeded) => None,
                Some(s) if s.is_final() => Some(format!("job {d} ended {}: this job would never run", s.as_str())),
                Some(s) => Some(format!("waiting for job {d} to succeed (it is {})", s.as_str())),
                None => Some(format!("job {d} no longer exists")),
            }
        })
    }
}

/// GPUs now, or why it would wait; estimated start.
type Planned = (Vec<u32>, Option<String>, Option<i64>);

/// A previewed job as the queue in memory would hold it once queued.
fn preview_row(j: &ValidJob, id: i64, owner: &Owner, now: i64) -> QueuedRow {
    QueuedRow {
        id,
        name: j.name.clone(),
        owner_uid: owner.uid,
        owner: owner.name.clone(),
        image: j.spec.image.clone(),
        gpus: j.gpus,
        gpu_memory: j.gpu_memory,
        priority: j.spec.priority,
        submitted_at: now,
        not_before: j.begin_ms,
        expected_runtime_ms: j.expected_runtime.map(|d| d.as_millis() as i64),
        after: vec![],
        held: false,
        gpu_filter: spec::gpu_filter(j.spec.gpu_type.as_deref(), j.spec.min_gpu_memory.as_deref()),
        cpus_milli: j.limits.cpus_milli,
        memory: j.limits.memory,
        started_at: None,
        interactive: j.spec.interactive,
        begin_ms: j.begin_ms,
    }
}
