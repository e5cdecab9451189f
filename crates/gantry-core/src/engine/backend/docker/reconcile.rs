//! Docker's side of recovery: open attempts + containers found -> actions, decided by a pure
//! function tested by a table; [`reconcile_containers`] gathers the facts, cleans up what the table
//! says to, and hands the rest to the engine as [`Resumed`].
//!
//! A container Docker lists as `created` may be mid-start (an engine killed inside `docker start`:
//! the start goes on, and the job begins): the table decides nothing about it until it has been
//! inspected once the start settled ([`Action::Inspect`], `Executor::settle`), then follows it,
//! records its end, or queues the job again only if it never began.

use std::sync::Arc;

use tracing::{info, warn};

use super::DockerBackend;
use crate::engine::backend::{Open, Resumed};
use crate::engine::{Engine, EngineError};
use crate::executor::{ExecError, Found, Life};
use crate::outcome::How;
use crate::protocol::Orphan;
use crate::store::RunRef;

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
    /// Listed as created: a start may be in flight and its job may run. Inspect it (once the start
    /// settled) and decide again; nothing else is done with it before.
    Inspect { job_id: i64, container_id: String },
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
            Some(f) if f.life == Life::Running => Action::Reattach {
                job_id: a.job_id,
                container_id: f.container_id.clone(),
            },
            Some(f) if f.life == Life::Exited => Action::Record {
                job_id: a.job_id,
                container_id: f.container_id.clone(),
            },
            Some(f) if f.life == Life::Unsettled => Action::Inspect {
                job_id: a.job_id,
                container_id: f.container_id.clone(),
            },
            // Settled: no start ever gave it a process.
            Some(f) => Action::Requeue {
                job_id: a.job_id,
                container_id: Some(f.container_id.clone()),
            },
            // Never created (the engine died between claiming and creating): it never ran.
            None if a.container_id.is_none() => Action::Requeue {
                job_id: a.job_id,
                container_id: None,
            },
            None => Action::Lost { job_id: a.job_id },
        });
    }
    for (f, known) in found {
        if open.iter().any(|a| matches(a, f)) {
            continue;
        }
        if *known && same_db(f) && f.life != Life::Running {
            actions.push(Action::Remove {
                container_id: f.container_id.clone(),
            });
        } else if !(*known && same_db(f)) {
            actions.push(Action::Orphan(f.clone()));
        }
        // Known, recorded as ended, yet running: left alone until it exits (then removed as above).
    }
    actions
}

/// Match the open attempts with the containers Docker has. Docker away: nothing is decided (the
/// attempts stay held; they are reconciled when it is back).
pub(super) async fn reconcile_containers(
    d: &DockerBackend,
    e: &Arc<Engine>,
    open: &[Open<'_>],
) -> Result<Vec<(i64, Resumed)>, EngineError> {
    let found = match d.exec.list_ours(&e.engine_id).await {
        Ok(f) => f,
        Err(err) => {
            warn!("cannot reconcile running jobs yet: {err}");
            e.health.write().unwrap().backend_problem = Some(err.to_string());
            return Ok(vec![]);
        }
    };
    let mut facts = vec![];
    for f in found {
        let known = e.store().attempt_with_container(f.job_id, &f.container_id);
        let known = known
            .map_err(|err| EngineError::Fatal(format!("cannot read attempts: {err}")))?
            .is_some();
        facts.push((f, known));
    }
    let docker_away = |err: ExecError| {
        warn!("cannot reconcile running jobs yet: {err}");
        e.health.write().unwrap().backend_problem = Some(err.to_string());
        Ok(vec![])
    };
    let opens: Vec<OpenAttempt> = open
        .iter()
        .map(|o| OpenAttempt {
            job_id: o.job.id,
            attempt_id: o.attempt.id,
            container_id: o.attempt.run_ref().and_then(|r| r.container().map(String::from)),
            expected_name: e.container_name(o.job.id, o.attempt.n),
            monitored: o.monitored,
        })
        .collect();
    let mut actions = reconcile(&opens, &facts, &e.db_uid);
    // Containers listed as created: what they really are once any start in flight has settled.
    let unsettled: Vec<String> = actions
        .iter()
        .filter_map(|a| {
            if let Action::Inspect { container_id, .. } = a {
                Some(container_id.clone())
            } else {
                None
            }
        })
        .collect();
    if !unsettled.is_empty() {
        for cid in unsettled {
            match d.exec.settle(&cid).await {
                Ok(Some(settled)) => {
                    if let Some((f, _)) = facts.iter_mut().find(|(f, _)| f.container_id == cid) {
                        f.life = settled.into();
                    }
                }
                Ok(None) => facts.retain(|(f, _)| f.container_id != cid),
                Err(err) => return docker_away(err),
            }
        }
        actions = reconcile(&opens, &facts, &e.db_uid);
    }
    // Every start has settled: a container that started (or ended) holds its own binds, and one of ours is
    // never started again, so pins an engine killed inside a start left behind go now.
    for (f, _) in &facts {
        if matches!(f.life, Life::Running | Life::Exited) && f.db_uid.as_deref().is_none_or(|d| d == e.db_uid) {
            e.unpin_staging(&f.name);
        }
    }
    let mut out = vec![];
    let mut orphans = vec![];
    for action in actions {
        match action {
            // Never here: every container listed as created was settled above.
            Action::Inspect { .. } => {}
            Action::Reattach { job_id, container_id } => {
                info!(job = job_id, "reattaching to running container");
                let marked = e.store().set_running(job_id);
                if let Err(err) = marked {
                    e.store_failed(&format!("marking job {job_id} running"), &err);
                }
                out.push((job_id, Resumed::Follow(RunRef::Container(container_id))));
            }
            Action::Record { job_id, container_id } => {
                // It ran (a start that went through while no engine ran leaves the job `starting`).
                if let Err(err) = e.store().set_running(job_id) {
                    e.store_failed(&format!("marking job {job_id} running"), &err);
                }
                out.push((job_id, Resumed::EndedWhileAway(RunRef::Container(container_id))))
            }
            Action::Requeue { job_id, container_id } => out.push((
                job_id,
                Resumed::End {
                    how: How::NeverStarted,
                    run: container_id.map(RunRef::Container),
                },
            )),
            Action::Lost { job_id } => out.push((
                job_id,
                Resumed::End {
                    how: How::Lost("its container is gone (removed, or lost with the Docker engine)".into()),
                    run: None,
                },
            )),
            Action::Remove { container_id } => {
                let _ = d.exec.remove(&container_id).await;
                if let Some((f, _)) = facts.iter().find(|(f, _)| f.container_id == container_id) {
                    e.release_staging(&f.name);
                }
            }
            Action::Orphan(f) => {
                warn!(
                    "orphan container {} ({}) from job {} is not in this database (a lost or replaced database?): \
                     left alone and its GPUs count as busy; inspect it with `docker logs {}`, remove it with `docker rm -f {}`",
                    f.name, &f.container_id[..12.min(f.container_id.len())], f.job_id, f.name, f.name
                );
                orphans.push(Orphan {
                    container_id: f.container_id,
                    name: f.name,
                    job_id: f.job_id,
                    running: f.life == Life::Running,
                    gpus: f.gpus,
                });
            }
        }
    }
    e.health.write().unwrap().orphans = orphans;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::Settled;

    fn found(job: i64, cid: &str, name: &str, life: Life, db: Option<&str>) -> Found {
        Found {
            container_id: cid.into(),
            name: name.into(),
            job_id: job,
            attempt_id: 1,
            db_uid: db.map(String::from),
            gpus: vec![0],
            life,
        }
    }
    fn open(job: i64, cid: Option<&str>, name: &str) -> OpenAttempt {
        OpenAttempt {
            job_id: job,
            attempt_id: job * 10,
            container_id: cid.map(String::from),
            expected_name: name.into(),
            monitored: false,
        }
    }

    #[test]
    fn reconcile_table() {
        let d = Some("db1");
        // (open attempts, found containers with "known to the database", expected actions)
        #[allow(clippy::type_complexity)] // a table test: one tuple per case reads as the table
        let rows: Vec<(&str, Vec<OpenAttempt>, Vec<(Found, bool)>, Vec<Action>)> = vec![
            (
                "running container -> reattach",
                vec![open(1, Some("c1"), "n1")],
                vec![(found(1, "c1", "n1", Life::Running, d), true)],
                vec![Action::Reattach {
                    job_id: 1,
                    container_id: "c1".into(),
                }],
            ),
            (
                "exited while away -> record",
                vec![open(1, Some("c1"), "n1")],
                vec![(found(1, "c1", "n1", Life::Exited, d), true)],
                vec![Action::Record {
                    job_id: 1,
                    container_id: "c1".into(),
                }],
            ),
            (
                "created, never started -> requeue",
                vec![open(1, Some("c1"), "n1")],
                vec![(found(1, "c1", "n1", Life::Created, d), true)],
                vec![Action::Requeue {
                    job_id: 1,
                    container_id: Some("c1".into()),
                }],
            ),
            // Issue 18, item 14: killed inside `docker start`, the start goes on; Docker lists `created` meanwhile.
            (
                "listed as created: a start may be in flight -> inspect, nothing else",
                vec![open(1, Some("c1"), "n1")],
                vec![(found(1, "c1", "n1", Life::Unsettled, d), true)],
                vec![Action::Inspect {
                    job_id: 1,
                    container_id: "c1".into(),
                }],
            ),
            (
                "listed as created, id not recorded yet: matched by name -> inspect",
                vec![open(1, None, "n1")],
                vec![(found(1, "c9", "n1", Life::Unsettled, d), false)],
                vec![Action::Inspect {
                    job_id: 1,
                    container_id: "c9".into(),
                }],
            ),
            // ... and once inspected (the start settled): the job is followed, never started again.
            (
                "inspected: began and runs -> reattach",
                vec![open(1, Some("c1"), "n1")],
                vec![(found(1, "c1", "n1", Settled::Running.into(), d), true)],
                vec![Action::Reattach {
                    job_id: 1,
                    container_id: "c1".into(),
                }],
            ),
            (
                "inspected: began and ended -> record its end",
                vec![open(1, Some("c1"), "n1")],
                vec![(found(1, "c1", "n1", Settled::Ended.into(), d), true)],
                vec![Action::Record {
                    job_id: 1,
                    container_id: "c1".into(),
                }],
            ),
            (
                "inspected: never began -> requeue",
                vec![open(1, Some("c1"), "n1")],
                vec![(found(1, "c1", "n1", Settled::NeverStarted.into(), d), true)],
                vec![Action::Requeue {
                    job_id: 1,
                    container_id: Some("c1".into()),
                }],
            ),
            (
                "listed as created, a recorded end -> remove (its start was never sent, or failed)",
                vec![],
                vec![(found(1, "c1", "n1", Life::Unsettled, d), true)],
                vec![Action::Remove {
                    container_id: "c1".into(),
                }],
            ),
            (
                "listed as created, another database's -> orphan",
                vec![],
                vec![(found(5, "c5", "n5", Life::Unsettled, Some("old")), false)],
                vec![Action::Orphan(found(5, "c5", "n5", Life::Unsettled, Some("old")))],
            ),
            (
                "container id not recorded yet: matched by name",
                vec![open(1, None, "n1")],
                vec![(found(1, "c9", "n1", Life::Running, d), false)],
                vec![Action::Reattach {
                    job_id: 1,
                    container_id: "c9".into(),
                }],
            ),
            (
                "never created -> requeue without a container",
                vec![open(1, None, "n1")],
                vec![],
                vec![Action::Requeue {
                    job_id: 1,
                    container_id: None,
                }],
            ),
            (
                "container gone -> lost",
                vec![open(1, Some("c1"), "n1")],
                vec![],
                vec![Action::Lost { job_id: 1 }],
            ),
            (
                "recorded and exited -> remove",
                vec![],
                vec![(found(1, "c1", "n1", Life::Exited, d), true)],
                vec![Action::Remove {
                    container_id: "c1".into(),
                }],
            ),
            (
                "recorded but still running -> left alone",
                vec![],
                vec![(found(1, "c1", "n1", Life::Running, d), true)],
                vec![],
            ),
            (
                "unknown to the database -> orphan, never adopted",
                vec![],
                vec![(found(5, "c5", "n5", Life::Running, d), false)],
                vec![Action::Orphan(found(5, "c5", "n5", Life::Running, d))],
            ),
            // A lost WAL reused job id 1: the old container has another name, so the new job is not fooled.
            (
                "same job id, other name -> new job never created, old one orphan",
                vec![open(1, None, "gantry-db1-j1-a1")],
                vec![(found(1, "c1", "gantry-old-j1-a1", Life::Running, Some("old")), false)],
                vec![
                    Action::Requeue {
                        job_id: 1,
                        container_id: None,
                    },
                    Action::Orphan(found(1, "c1", "gantry-old-j1-a1", Life::Running, Some("old"))),
                ],
            ),
            (
                "another database's container with a recorded id is still an orphan",
                vec![open(1, Some("c1"), "n1")],
                vec![(found(1, "c1", "n1", Life::Running, Some("other")), true)],
                vec![
                    Action::Lost { job_id: 1 },
                    Action::Orphan(found(1, "c1", "n1", Life::Running, Some("other"))),
                ],
            ),
            (
                "already followed (Docker came back) -> nothing",
                vec![OpenAttempt {
                    monitored: true,
                    ..open(1, Some("c1"), "n1")
                }],
                vec![(found(1, "c1", "n1", Life::Running, d), true)],
                vec![],
            ),
        ];
        for (what, opens, founds, want) in rows {
            assert_eq!(reconcile(&opens, &founds, "db1"), want, "{what}");
        }
    }
}
