//! Crash recovery (phase 1 of the loop): every open attempt is held (its GPUs, CPU and RAM) before
//! anything is placed, then the backend's pure table decides what becomes of each one
//! ([`Backend::reconcile`](super::backend::Backend::reconcile)), and this applies it: follow it
//! again, copy and record an end that happened while the engine was away, or record an end now.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::backend::{Open, Resumed, Since};
use super::{Engine, EngineError, RunHandle};
use crate::store::{Attempt, Job};

impl Engine {
    /// Reconcile every open attempt with the backend (on start, and when the backend comes back).
    /// A database error here is fatal: guessing would run jobs twice or lose them.
    pub async fn recover(self: Arc<Self>) -> Result<(), EngineError> {
        let open = self
            .store()
            .open_attempts()
            .map_err(|e| EngineError::Fatal(format!("cannot read the running jobs to reattach them: {e}")))?;
        // Hold their GPUs (and CPU and RAM) before anything else is scheduled.
        {
            let policy = self.policy();
            let victims: Vec<Option<crate::scheduler::Victim>> = open
                .iter()
                .map(|(j, a)| {
                    self.victim_of(j, a.started_at).map(|mut v| {
                        // An engine killed mid-preemption: the preemption goes on (its supervisor finishes it).
                        v.stopping_for = self.reader().preempting(a.id).ok().flatten().map(|p| p.0);
                        v
                    })
                })
                .collect();
            let mut victims = victims.into_iter();
            let mut r = self.running.lock().unwrap();
            for (j, a) in &open {
                let victim = victims.next().flatten();
                r.entry(j.id).or_insert_with(|| RunHandle {
                    over_memory: None,
                    key: j.key(),
                    owner: j.owner.clone(),
                    gpus: a.gpus.clone(),
                    gpu_memory: self.gpu_memory_of(&j.key(), j.gpu_memory),
                    run: a.run_ref(),
                    cancel: CancellationToken::new(),
                    monitored: false,
                    expected_end: j.job.expected_runtime.map(|r| a.started_at + r.as_millis() as i64),
                    declared: j.job.expected_runtime.map(|r| crate::scheduler::Declared {
                        started_ms: a.started_at,
                        runtime_ms: r.as_millis() as i64,
                    }),
                    learn: j.job.expected_runtime.is_none().then(|| (j.key(), a.started_at)),
                    needs: self.job_needs(
                        &policy,
                        j.gpus,
                        j.job.limits.cpus_milli,
                        j.job.limits.memory,
                        j.gpu_memory,
                    ),
                    // Running containers' pins are read from Docker when the next job is pinned.
                    cpuset: vec![],
                    victim,
                    preempt: CancellationToken::new(),
                });
            }
        }
        let opens: Vec<Open> = {
            let r = self.running.lock().unwrap();
            open.iter()
                .map(|(job, attempt)| Open {
                    job,
                    attempt,
                    monitored: r.get(&job.id).is_some_and(|h| h.monitored),
                })
                .collect()
        };
        let actions = self.backend.reconcile(&self, &opens).await?;
        for (job_id, action) in actions {
            let Some((job, attempt)) = open.iter().find(|(j, _)| j.id == job_id).cloned() else {
                continue;
            };
            self.resume(job, attempt, action);
        }
        self.wake.notify_one();
        Ok(())
    }

    /// Apply recovery's decision for one attempt in its own supervisor task.
    fn resume(self: &Arc<Self>, job: Job, attempt: Attempt, action: Resumed) {
        let cancel = {
            let mut r = self.running.lock().unwrap();
            let Some(h) = r.get_mut(&job.id) else { return };
            h.monitored = true;
            if let Resumed::Follow(run) | Resumed::EndedWhileAway(run) = &action {
                h.run = Some(run.clone());
            }
            h.cancel.clone()
        };
        // Cancelled before the restart, and not stopped yet: stop it now.
        if job.cancel_requested {
            cancel.cancel();
        }
        let e = self.clone();
        let job_id = job.id;
        self.supervise(job_id, async move {
            let action = match action {
                Resumed::Find => match e.backend.find(&e, &job, &attempt).await {
                    Some(found) => found,
                    None => return,
                },
                other => other,
            };
            if let Resumed::Follow(run) | Resumed::EndedWhileAway(run) = &action {
                if let Some(h) = e.running.lock().unwrap().get_mut(&job.id) {
                    h.run = Some(run.clone());
                }
            }
            match action {
                Resumed::Follow(run) => e.follow(job, attempt, run, cancel, Since::Recovered).await,
                Resumed::EndedWhileAway(run) => e.follow(job, attempt, run, cancel, Since::EndedWhileAway).await,
                Resumed::End { how, run } => e.end_attempt(job.id, &attempt, &how, run.as_ref()).await,
                Resumed::Find => {
                    let how =
                        crate::outcome::How::Lost(format!("the {} backend cannot say where it runs", e.backend.name()));
                    e.end_attempt(job.id, &attempt, &how, None).await
                }
            }
        });
    }
}
