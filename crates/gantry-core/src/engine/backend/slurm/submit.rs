//! Handing attempts to Slurm: each job checked as its owner (the lab's container rules, its mounts),
//! then `sbatch` as them; a `matrix` as one `sbatch --array`. The Slurm id is recorded right after.

use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{owner, Shared};
use crate::access::{self, Cred};
use crate::config::STORE_RETRY;
use crate::engine::backend::{Launched, Placed};
use crate::engine::{append_log, Engine};
use crate::outcome::How;
use crate::slurm::{self as sl, Submission};
use crate::store::{Attempt, Job, JobState, QueuedRow, RunRef};

/// Why submitting failed, and whether retrying can help.
pub(super) enum SubmitError {
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
        SubmitError::Failed {
            transient: e.is_transient(),
            message: e.to_string(),
        }
    }
}

fn how_of(e: SubmitError) -> How {
    match e {
        SubmitError::Refused(m) => How::Refused(m),
        SubmitError::Failed { message, transient } => How::StartFailed { message, transient },
    }
}

/// The output file of an attempt, in the owner's folder of the shared log dir (or their home).
pub(super) fn output_name(e: &Engine, job_id: i64, attempt_n: u32) -> String {
    format!("{}-{job_id}-a{attempt_n}.out", e.db_uid)
}

/// The `GANTRY_METRICS` file beside output file `out` for the run after `restarts` Slurm requeues.
pub(super) fn metrics_name(out: &str, restarts: u32) -> String {
    format!("{}-r{restarts}.metrics.jsonl", out.strip_suffix(".out").unwrap_or(out))
}

/// The Slurm runs a queued job runs after (`--dependency=afterok`), or why it must wait in Gantry
/// first. A dependency that has ended without success fails the job, as with the local backend.
pub(super) fn after(e: &Engine, j: &QueuedRow) -> Result<Vec<RunRef>, String> {
    let mut runs = vec![];
    for d in &j.after {
        let dep = e.reader().job(*d);
        match dep {
            Ok(Some(dep)) if dep.state == JobState::Succeeded => {}
            Ok(Some(dep)) if dep.state.is_final() => {
                let msg = format!("dependency job {d} ended {}; this job will not run", dep.state.as_str());
                match e.store().fail_queued(j.id, &msg) {
                    Ok(true) => e.notify_job(j.id, JobState::Failed),
                    Ok(false) => {}
                    Err(err) => e.store_failed(&format!("failing job {}", j.id), &err),
                }
                return Err(msg);
            }
            Ok(Some(dep)) => {
                // In Slurm on its last attempt: Slurm holds this one until it succeeds. A dependency
                // that may still be retried gets a new Slurm id, so this job waits in Gantry.
                let open = e.reader().open_attempt(dep.id).ok().flatten();
                match open
                    .filter(|a| a.n > dep.retries)
                    .and_then(|a| a.run_ref())
                    .filter(|r| matches!(r, RunRef::Slurm { .. }))
                {
                    Some(run) => runs.push(run),
                    None => return Err(format!("waiting for job {d} to succeed (it is {})", dep.state.as_str())),
                }
            }
            Ok(None) => return Err(format!("dependency job {d} no longer exists")),
            Err(err) => return Err(format!("cannot read dependency job {d}: {err}")),
        }
    }
    Ok(runs)
}

/// What the attempts of a job before `attempt` did with Slurm job `run`: how many followed it (each
/// ended when Slurm requeued it), and the number of the one that submitted it (its output file).
pub(super) fn followed(e: &Engine, job_id: i64, attempt: &Attempt, run: &RunRef) -> (u32, u32) {
    let before: Vec<Attempt> = e
        .reader()
        .attempts(job_id)
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.n < attempt.n && a.run_ref().as_ref() == Some(run))
        .collect();
    (
        before.len() as u32,
        before.iter().map(|a| a.n).min().unwrap_or(attempt.n),
    )
}

/// The Slurm job this job's last preempted attempt followed, when Slurm requeued it and still has it
/// queued or running (owned by the job's owner, carrying this database's marker): `attempt` takes it
/// over. `Err`: Slurm or the database cannot say now (the attempt is tried again shortly, so a
/// requeued job is never submitted twice).
async fn requeued_run(e: &Engine, s: &Shared, job: &Job, attempt: &Attempt) -> Result<Option<RunRef>, String> {
    let attempts = e
        .reader()
        .attempts(job.id)
        .map_err(|err| format!("cannot read job {}'s attempts: {err}", job.id))?;
    let last = attempts
        .iter()
        .filter(|a| a.n < attempt.n)
        .filter_map(|a| a.run_ref().map(|r| (a, r)))
        .max_by_key(|(a, _)| a.n);
    let Some((prev, run)) =
        last.filter(|(a, r)| a.reason == Some(crate::store::EndReason::Preempted) && matches!(r, RunRef::Slurm { .. }))
    else {
        return Ok(None);
    };
    let RunRef::Slurm { id, task } = run else {
        return Ok(None);
    };
    let base = attempts
        .iter()
        .filter(|a| a.n <= prev.n && a.run_ref().as_ref() == Some(&run))
        .count() as u32;
    let jobs = s
        .client
        .queue()
        .await
        .map_err(|err| format!("cannot ask Slurm whether job {run} was requeued: {err}"))?;
    let jobs: std::collections::HashMap<u64, sl::SqJob> = jobs.into_iter().map(|j| (j.job_id, j)).collect();
    let prefix = format!("gantry:{}:{}:", e.db_uid, job.id);
    let mine = sl::find_job(&jobs, id, task).filter(|j| {
        sl::number(&j.user_id) == Some(job.owner_uid as i64)
            && j.comment
                .as_deref()
                .is_some_and(|c| c.starts_with(&prefix) || c.starts_with(&format!("gantry:{}:array:", e.db_uid)))
    });
    Ok(mine
        .filter(|j| sl::adoptable(&j.state(), j.restarts(), base))
        .map(|_| run.clone()))
}

/// Record the Slurm id, retrying until the write succeeds (nothing new starts meanwhile). False on
/// shutdown first: the next start finds the job by its marker.
pub(super) async fn record_run(e: &Engine, job_id: i64, attempt: &Attempt, run: &RunRef) -> bool {
    loop {
        let written = e.store().set_run(attempt.id, run);
        match written {
            Ok(()) => {
                e.store_ok();
                if let Some(h) = e.running.lock().unwrap().get_mut(&job_id) {
                    h.run = Some(run.clone());
                }
                return true;
            }
            Err(err) => {
                e.store_failed(&format!("recording the Slurm id of job {job_id}"), &err);
                tokio::select! {
                    _ = tokio::time::sleep(STORE_RETRY) => {}
                    _ = e.shutdown.cancelled() => return false,
                }
            }
        }
    }
}

/// Check the job as its owner, submit it to Slurm as them, record the Slurm id.
pub(super) async fn launch_one(
    e: &Arc<Engine>,
    s: &Shared,
    job: &Job,
    attempt: &Attempt,
    placed: &Placed,
    cancel: &CancellationToken,
) -> Launched {
    let log = e.log_of(job.id);
    // Preempted by a requeue: the same Slurm job runs again (Slurm's queue has it), not a new one.
    match requeued_run(e, s, job, attempt).await {
        Ok(Some(run)) => {
            if !record_run(e, job.id, attempt, &run).await {
                return Launched::Shutdown;
            }
            append_log(
                &log,
                &format!(
                    "attempt {}: Slurm job {run} was requeued; it runs again as this attempt (not submitted again)",
                    attempt.n
                ),
            );
            info!(job = job.id, slurm = %run, "following the requeued Slurm job");
            s.refresh.notify_one();
            return Launched::Started { run, at: e.now() };
        }
        Ok(None) => {}
        Err(err) => {
            return Launched::Ended {
                how: How::StartFailed {
                    message: err,
                    transient: true,
                },
                run: None,
            }
        }
    }
    append_log(
        &log,
        &format!("attempt {} of job {}: submitting to Slurm", attempt.n, job.id),
    );
    let after = placed.after.iter().map(RunRef::to_string).collect();
    let submitted = submit_one(e, s, job, attempt, after, cancel).await;
    let id = match submitted {
        Ok(Some(id)) => id,
        Ok(None) => {
            return Launched::Ended {
                how: How::CancelledBeforeStart,
                run: None,
            }
        }
        Err(err) => {
            let how = how_of(err);
            if let How::Refused(m) | How::StartFailed { message: m, .. } = &how {
                append_log(&log, &format!("not submitted: {m}"));
                warn!(job = job.id, "not submitted to Slurm: {m}");
            }
            return Launched::Ended { how, run: None };
        }
    };
    let at = e.now();
    let run = RunRef::Slurm { id, task: None };
    if !record_run(e, job.id, attempt, &run).await {
        return Launched::Shutdown;
    }
    append_log(&log, &format!("submitted as Slurm job {id}"));
    info!(job = job.id, slurm = id, "submitted to Slurm");
    s.refresh.notify_one();
    Launched::Started { run, at }
}

/// A preemptible job's checkpoint signal and grace (the spec's, else SIGTERM and the lab's stop
/// grace); `None` when preemption is off or the job is not preemptible.
pub(super) fn checkpoint(e: &Engine, job: &Job) -> Option<sl::Checkpoint> {
    let policy = e.policy();
    (policy.preemption.enabled && policy.preemption.preemptible(&job.job.spec)).then(|| sl::Checkpoint {
        signal: job.job.spec.checkpoint_signal(),
        grace: job.job.spec.checkpoint_grace().unwrap_or(policy.stop_grace),
    })
}

async fn submit_one(
    e: &Engine,
    s: &Shared,
    job: &Job,
    attempt: &Attempt,
    after: Vec<String>,
    cancel: &CancellationToken,
) -> Result<Option<u64>, SubmitError> {
    let policy = e.policy();
    policy.containers.check(&job.job, &|k| e.set_in(k))?;
    let home = Engine::home_of(job.owner_uid)
        .map(PathBuf::from)
        .ok_or_else(|| SubmitError::Refused(format!("user {} has no home folder to run the job from", job.owner)))?;
    // The same mount checks as the local backend, as the owner, right before submitting.
    let cred = Cred::of_user(job.owner_uid, job.owner_gid);
    let checked = access::check_mounts_async(
        cred,
        job.job.mounts.clone(),
        job.job.spec.workdir.clone(),
        e.forbidden(),
    )
    .await?;
    let mounts = checked.into_iter().map(|c| c.mount).collect();
    let file = output_name(e, job.id, attempt.n);
    let mut metrics = None;
    let output = match &s.settings.log_dir {
        Some(d) => {
            let dir = sl::user_log_dir(d, job.owner_uid, job.owner_gid)?;
            metrics = Some(dir.join(file.strip_suffix(".out").unwrap_or(&file)));
            dir.join(&file)
        }
        None => {
            let p = home.join(&file);
            append_log(&e.log_of(job.id), &format!("no shared log folder is configured ([slurm] log_dir): Slurm writes this job's output on its node to {}", p.display()));
            p
        }
    };
    let sub = Submission {
        job: &job.job,
        marker: sl::marker(&e.db_uid, job.id, attempt.n),
        uid: job.owner_uid,
        gid: job.owner_gid,
        home,
        output,
        priority_range: policy.user_priority,
        after,
        mounts,
        metrics,
        preempt: checkpoint(e, job),
        restarts: e
            .reader()
            .preemptions(job.id, 0)
            .map_err(|err| SubmitError::Failed {
                message: format!("cannot read job {}'s attempts: {err}", job.id),
                transient: true,
            })?
            .0,
    };
    let args = sl::sbatch_args(&sub, &s.settings)?;
    let script = sl::batch_script(&sub, job.id, attempt.n, s.settings.runtime);
    let cancel_requested = e.store().job(job.id).ok().flatten().is_some_and(|j| j.cancel_requested);
    if cancel.is_cancelled() || cancel_requested {
        return Ok(None);
    }
    Ok(Some(s.client.submit(&owner(job), &args, &script).await?))
}

/// A matrix's first attempts as one job array; each task's id recorded.
pub(super) async fn launch_array(
    e: &Arc<Engine>,
    s: &Shared,
    parts: &[(Job, Attempt, CancellationToken)],
    placed: &Placed,
) -> Vec<Launched> {
    for (job, attempt, _) in parts {
        append_log(
            &e.log_of(job.id),
            &format!(
                "attempt {} of job {}: submitting to Slurm with its matrix as one job array",
                attempt.n, job.id
            ),
        );
    }
    let after = placed.after.iter().map(RunRef::to_string).collect();
    let submitted = submit_array(e, s, parts, after).await;
    let master = match submitted {
        Ok(m) => m,
        Err(err) => {
            let how = how_of(err);
            if let How::Refused(m) | How::StartFailed { message: m, .. } = &how {
                for (job, _, _) in parts {
                    append_log(&e.log_of(job.id), &format!("not submitted: {m}"));
                }
            }
            return parts
                .iter()
                .map(|_| Launched::Ended {
                    how: how.clone(),
                    run: None,
                })
                .collect();
        }
    };
    let at = e.now();
    info!(
        slurm = master,
        "submitted {} jobs to Slurm as one job array",
        parts.len()
    );
    let mut out = vec![];
    for (job, attempt, _) in parts {
        let run = RunRef::Slurm {
            id: master,
            task: job.job.matrix_part.as_ref().map(|p| p.index),
        };
        if !record_run(e, job.id, attempt, &run).await {
            return parts.iter().map(|_| Launched::Shutdown).collect();
        }
        append_log(&e.log_of(job.id), &format!("submitted as Slurm job {run}"));
        out.push(Launched::Started { run, at });
    }
    s.refresh.notify_one();
    out
}

/// Checks each job as its owner, then one `sbatch --array` whose script runs each task's job.
async fn submit_array(
    e: &Engine,
    s: &Shared,
    parts: &[(Job, Attempt, CancellationToken)],
    after: Vec<String>,
) -> Result<u64, SubmitError> {
    let policy = e.policy();
    let first = &parts[0].0;
    let group = first
        .job
        .matrix_part
        .as_ref()
        .map(|p| p.group.clone())
        .unwrap_or_default();
    let home = Engine::home_of(first.owner_uid)
        .map(PathBuf::from)
        .ok_or_else(|| SubmitError::Refused(format!("user {} has no home folder to run the job from", first.owner)))?;
    let pattern = format!("{}-arr{group}-%a.out", e.db_uid);
    let output = match &s.settings.log_dir {
        Some(d) => sl::user_log_dir(d, first.owner_uid, first.owner_gid)?.join(&pattern),
        None => home.join(&pattern),
    };
    let marker = sl::array_marker(&e.db_uid, &group);
    let mut subs = vec![];
    for (job, _, _) in parts {
        policy.containers.check(&job.job, &|k| e.set_in(k))?;
        let cred = Cred::of_user(job.owner_uid, job.owner_gid);
        let checked = access::check_mounts_async(
            cred,
            job.job.mounts.clone(),
            job.job.spec.workdir.clone(),
            e.forbidden(),
        )
        .await?;
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
            metrics: s.settings.log_dir.as_ref().and_then(|_| {
                let p = job.job.matrix_part.as_ref()?;
                Some(output.with_file_name(format!("{}-arr{}-{}", e.db_uid, p.group, p.index)))
            }),
            preempt: checkpoint(e, job),
            restarts: 0,
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
    Ok(s.client.submit(&owner(first), &args, &script).await?)
}
