//! Crash recovery: open attempts + containers found -> actions. The decision is a pure function
//! tested by a table; [`Engine::recover`] gathers the facts and applies the actions.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::outcome::How;
use super::{Engine, EngineError, RunHandle};
use crate::executor::{Found, Life};
use crate::protocol::Orphan;

/// An attempt the database says has not ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenAttempt {
    pub job_id: i64,
    pub attempt_id: i64,
    pub container_id: Option<String>,
    /// The container name this attempt's container has (see `Engine::container_name`).
    pub expected_name: String,
    /// A live supervisor already follows it (recovery after a Docker outage).
    pub monitored: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Still running: follow it again (logs, timeout, wait).
    Reattach { job_id: i64, container_id: String },
    /// Exited while we were away: copy its remaining output, record its real exit code.
    Record { job_id: i64, container_id: String },
    /// Claimed but never started: it never ran, queue it again.
    Requeue { job_id: i64, container_id: Option<String> },
    /// Its container is gone.
    Lost { job_id: i64 },
    /// Ours, its end already recorded, not running: clean up.
    Remove { container_id: String },
    /// Not in this database (a lost WAL, a replaced database): report, never adopt, never remove.
    Orphan(Found),
}

/// `found_known`: for each found container, whether this database has an attempt with that container
/// (ended or not). `db_uid`: this database's id; containers labelled with another belong to another database.
pub fn reconcile(open: &[OpenAttempt], found: &[(Found, bool)], db_uid: &str) -> Vec<Action> {
    let same_db = |f: &Found| f.db_uid.as_deref().is_none_or(|d| d == db_uid);
    let matches = |a: &OpenAttempt, f: &Found| {
        same_db(f)
            && f.job_id == a.job_id
            && match &a.container_id {
                Some(c) => *c == f.container_id,
                None => f.name == a.expected_name,
            }
    };
    let mut actions = vec![];
    for a in open {
        let mine = found.iter().map(|(f, _)| f).find(|f| matches(a, f));
        if a.monitored {
            continue;
        }
        actions.push(match mine {
            Some(f) if f.life == Life::Running => Action::Reattach { job_id: a.job_id, container_id: f.container_id.clone() },
            Some(f) if f.life == Life::Exited => Action::Record { job_id: a.job_id, container_id: f.container_id.clone() },
            Some(f) => Action::Requeue { job_id: a.job_id, container_id: Some(f.container_id.clone()) },
            // Never created (the engine died between claiming and creating): it never ran.
            None if a.container_id.is_none() => Action::Requeue { job_id: a.job_id, container_id: None },
            None => Action::Lost { job_id: a.job_id },
        });
    }
    for (f, known) in found {
        if open.iter().any(|a| matches(a, f)) {
            continue;
        }
        if *known && same_db(f) && f.life != Life::Running {
            actions.push(Action::Remove { container_id: f.container_id.clone() });
        } else if !(*known && same_db(f)) {
            actions.push(Action::Orphan(f.clone()));
        }
        // Known, recorded as ended, yet running: left alone until it exits (then removed as above).
    }
    actions
}

impl Engine {
    /// Reconcile every open attempt with the executor (on start, and when Docker comes back).
    /// A database error here is fatal: guessing would run jobs twice or lose them.
    pub async fn recover(self: Arc<Self>) -> Result<(), EngineError> {
        let open = self.store().open_attempts().map_err(|e| EngineError::Fatal(format!("cannot read the running jobs to reattach them: {e}")))?;
        // Hold their GPUs (and CPU and RAM) before anything else is scheduled.
        {
            let policy = self.policy();
            let mut r = self.running.lock().unwrap();
            for (j, a) in &open {
                r.entry(j.id).or_insert_with(|| RunHandle {
                    owner: j.owner.clone(),
                    gpus: a.gpus.clone(),
                    gpu_memory: j.gpu_memory,
                    container_id: a.container_id.clone(),
                    cancel: CancellationToken::new(),
                    monitored: false,
                    expected_end: j.job.expected_runtime.map(|r| a.started_at + r.as_millis() as i64),
                    learn: j.job.expected_runtime.is_none().then(|| (j.key(), a.started_at)),
                    needs: self.job_needs(&policy, j.gpus, j.job.limits.cpus_milli, j.job.limits.memory),
                });
            }
        }
        let found = match self.exec.list_ours(&self.engine_id).await {
            Ok(f) => f,
            Err(e) => {
                warn!("cannot reconcile running jobs yet: {e}");
                self.health.write().unwrap().docker_problem = Some(e.to_string());
                return Ok(());
            }
        };
        let mut facts = vec![];
        for f in found {
            let known = self.store().attempt_with_container(f.job_id, &f.container_id);
            let known = known.map_err(|e| EngineError::Fatal(format!("cannot read attempts: {e}")))?.is_some();
            facts.push((f, known));
        }
        let opens: Vec<OpenAttempt> = {
            let r = self.running.lock().unwrap();
            open.iter()
                .map(|(j, a)| OpenAttempt {
                    job_id: j.id,
                    attempt_id: a.id,
                    container_id: a.container_id.clone(),
                    expected_name: self.container_name(j.id, a.n),
                    monitored: r.get(&j.id).is_some_and(|h| h.monitored),
                })
                .collect()
        };
        let mut orphans = vec![];
        for action in reconcile(&opens, &facts, &self.db_uid) {
            let job_of = |id: i64| open.iter().find(|(j, _)| j.id == id).cloned();
            match action {
                Action::Reattach { job_id, container_id } => {
                    let Some((job, attempt)) = job_of(job_id) else { continue };
                    info!(job = job_id, "reattaching to running container");
                    let cancel = {
                        let mut r = self.running.lock().unwrap();
                        let Some(h) = r.get_mut(&job_id) else { continue };
                        h.monitored = true;
                        h.container_id = Some(container_id.clone());
                        h.cancel.clone()
                    };
                    let marked = self.store().set_running(job_id);
                    if let Err(e) = marked {
                        self.store_failed(&format!("marking job {job_id} running"), &e);
                    }
                    self.supervise(job_id, self.clone().monitor(job, attempt, container_id, cancel));
                }
                Action::Record { job_id, container_id } => {
                    let Some((job, attempt)) = job_of(job_id) else { continue };
                    self.mark_monitored(job_id);
                    self.supervise(job_id, self.clone().record_exited(job, attempt, container_id));
                }
                Action::Requeue { job_id, container_id } => {
                    let Some((_, attempt)) = job_of(job_id) else { continue };
                    self.mark_monitored(job_id);
                    let e = self.clone();
                    self.supervise(job_id, async move {
                        e.end_attempt(job_id, &attempt, &How::NeverStarted, container_id.as_deref()).await;
                    });
                }
                Action::Lost { job_id } => {
                    let Some((_, attempt)) = job_of(job_id) else { continue };
                    self.mark_monitored(job_id);
                    let e = self.clone();
                    self.supervise(job_id, async move {
                        e.end_attempt(job_id, &attempt, &How::Lost("its container is gone (removed, or lost with the Docker engine)".into()), None).await;
                    });
                }
                Action::Remove { container_id } => {
                    let _ = self.exec.remove(&container_id).await;
                    if let Some((f, _)) = facts.iter().find(|(f, _)| f.container_id == container_id) {
                        self.release_staging(&f.name);
                    }
                }
                Action::Orphan(f) => {
                    warn!(
                        "orphan container {} ({}) from job {} is not in this database (a lost or replaced database?): \
                         left alone and its GPUs count as busy; inspect it with `docker logs {}`, remove it with `docker rm -f {}`",
                        f.name, &f.container_id[..12.min(f.container_id.len())], f.job_id, f.name, f.name
                    );
                    orphans.push(Orphan { container_id: f.container_id, name: f.name, job_id: f.job_id, running: f.life == Life::Running, gpus: f.gpus });
                }
            }
        }
        self.health.write().unwrap().orphans = orphans;
        self.wake.notify_one();
        Ok(())
    }

    fn mark_monitored(&self, job_id: i64) {
        if let Some(h) = self.running.lock().unwrap().get_mut(&job_id) {
            h.monitored = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(job: i64, cid: &str, name: &str, life: Life, db: Option<&str>) -> Found {
        Found { container_id: cid.into(), name: name.into(), job_id: job, attempt_id: 1, db_uid: db.map(String::from), gpus: vec![0], life }
    }
    fn open(job: i64, cid: Option<&str>, name: &str) -> OpenAttempt {
        OpenAttempt { job_id: job, attempt_id: job * 10, container_id: cid.map(String::from), expected_name: name.into(), monitored: false }
    }

    #[test]
    fn reconcile_table() {
        let d = Some("db1");
        // (open attempts, found containers with "known to the database", expected actions)
        let rows: Vec<(&str, Vec<OpenAttempt>, Vec<(Found, bool)>, Vec<Action>)> = vec![
            ("running container -> reattach", vec![open(1, Some("c1"), "n1")], vec![(found(1, "c1", "n1", Life::Running, d), true)],
             vec![Action::Reattach { job_id: 1, container_id: "c1".into() }]),
            ("exited while away -> record", vec![open(1, Some("c1"), "n1")], vec![(found(1, "c1", "n1", Life::Exited, d), true)],
             vec![Action::Record { job_id: 1, container_id: "c1".into() }]),
            ("created, never started -> requeue", vec![open(1, Some("c1"), "n1")], vec![(found(1, "c1", "n1", Life::Created, d), true)],
             vec![Action::Requeue { job_id: 1, container_id: Some("c1".into()) }]),
            ("container id not recorded yet: matched by name", vec![open(1, None, "n1")], vec![(found(1, "c9", "n1", Life::Running, d), false)],
             vec![Action::Reattach { job_id: 1, container_id: "c9".into() }]),
            ("never created -> requeue without a container", vec![open(1, None, "n1")], vec![], vec![Action::Requeue { job_id: 1, container_id: None }]),
            ("container gone -> lost", vec![open(1, Some("c1"), "n1")], vec![], vec![Action::Lost { job_id: 1 }]),
            ("recorded and exited -> remove", vec![], vec![(found(1, "c1", "n1", Life::Exited, d), true)], vec![Action::Remove { container_id: "c1".into() }]),
            ("recorded but still running -> left alone", vec![], vec![(found(1, "c1", "n1", Life::Running, d), true)], vec![]),
            ("unknown to the database -> orphan, never adopted", vec![], vec![(found(5, "c5", "n5", Life::Running, d), false)],
             vec![Action::Orphan(found(5, "c5", "n5", Life::Running, d))]),
            // A lost WAL reused job id 1: the old container has another name, so the new job is not fooled.
            ("same job id, other name -> new job never created, old one orphan", vec![open(1, None, "gantry-db1-j1-a1")],
             vec![(found(1, "c1", "gantry-old-j1-a1", Life::Running, Some("old")), false)],
             vec![Action::Requeue { job_id: 1, container_id: None }, Action::Orphan(found(1, "c1", "gantry-old-j1-a1", Life::Running, Some("old")))]),
            ("another database's container with a recorded id is still an orphan", vec![open(1, Some("c1"), "n1")],
             vec![(found(1, "c1", "n1", Life::Running, Some("other")), true)],
             vec![Action::Lost { job_id: 1 }, Action::Orphan(found(1, "c1", "n1", Life::Running, Some("other")))]),
            ("already followed (Docker came back) -> nothing", vec![OpenAttempt { monitored: true, ..open(1, Some("c1"), "n1") }],
             vec![(found(1, "c1", "n1", Life::Running, d), true)], vec![]),
        ];
        for (what, opens, founds, want) in rows {
            assert_eq!(reconcile(&opens, &founds, "db1"), want, "{what}");
        }
    }
}
