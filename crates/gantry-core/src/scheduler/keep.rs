//! `[sessions] keep_free`: GPUs kept free of batch jobs so a session (`gantry shell`) starts at once.
//! Applied to a finished plan, so it never changes how `plan` places jobs.
//!
//! Rule: a GPU is free when no Gantry job holds it and no outside process busies it. Walking the
//! placements in plan order, a batch job that would take free GPUs and leave fewer than `keep` free
//! does not start (it waits, with [`KEPT_FREE`] as its reason); a session may take any of them.

use std::collections::HashSet;

use super::{Plan, State, Waiting};

/// Why a batch job waits for a GPU kept free.
pub const KEPT_FREE: &str = "kept free for interactive sessions ([sessions] keep_free)";

/// Drop from `plan` the batch placements that would leave fewer than `keep` GPUs free; `sessions`
/// are the queued jobs that are interactive sessions.
pub fn keep_free(plan: &mut Plan, state: &State, sessions: &HashSet<i64>, keep: u32) {
    if keep == 0 {
        return;
    }
    let held: HashSet<u32> = state.running.iter().flat_map(|r| r.gpus.iter().copied()).collect();
    let mut free: HashSet<u32> = state
        .gpus
        .iter()
        .filter(|g| !g.external_busy && !held.contains(&g.index))
        .map(|g| g.index)
        .collect();
    let mut kept = vec![];
    plan.placements.retain(|p| {
        let taken = p.gpus.iter().filter(|g| free.contains(g)).count();
        if !sessions.contains(&p.job_id) && taken > 0 && free.len() - taken < keep as usize {
            kept.push(p.job_id);
            return false;
        }
        for g in &p.gpus {
            free.remove(g);
        }
        true
    });
    for id in kept {
        let position = plan.waiting.len() + 1;
        plan.waiting.push(Waiting {
            job_id: id,
            position,
            reason: KEPT_FREE.to_string(),
            reserved: vec![],
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::{GpuView, Placement, RunningJob};

    fn state(gpus: u32, busy: &[u32], external: &[u32]) -> State {
        State {
            now_ms: 0,
            gpus: (0..gpus)
                .map(|i| GpuView {
                    index: i,
                    memory_total: 80,
                    external_busy: external.contains(&i),
                    ..Default::default()
                })
                .collect(),
            running: busy
                .iter()
                .map(|g| RunningJob {
                    job_id: 100 + *g as i64,
                    user: "u".into(),
                    gpus: vec![*g],
                    gpu_memory: None,
                    expected_end_ms: None,
                    needs: Default::default(),
                    victim: None,
                    declared: None,
                })
                .collect(),
            queued: vec![],
            config: Default::default(),
            typical_wait_ms: None,
            host: None,
        }
    }

    #[test]
    fn batch_jobs_leave_the_last_gpus_free_and_sessions_take_them() {
        struct Case {
            name: &'static str,
            gpus: u32,
            busy: Vec<u32>,
            external: Vec<u32>,
            keep: u32,
            /// (job, GPUs), in plan order.
            placed: Vec<(i64, Vec<u32>)>,
            sessions: Vec<i64>,
            want_started: Vec<i64>,
        }
        let cases = vec![
            Case {
                name: "keep 0 changes nothing",
                gpus: 2,
                busy: vec![],
                external: vec![],
                keep: 0,
                placed: vec![(1, vec![0]), (2, vec![1])],
                sessions: vec![],
                want_started: vec![1, 2],
            },
            Case {
                name: "a batch job may not take the last free GPU",
                gpus: 2,
                busy: vec![],
                external: vec![],
                keep: 1,
                placed: vec![(1, vec![0]), (2, vec![1])],
                sessions: vec![],
                want_started: vec![1],
            },
            Case {
                name: "a session may take it",
                gpus: 2,
                busy: vec![],
                external: vec![],
                keep: 1,
                placed: vec![(1, vec![0]), (2, vec![1])],
                sessions: vec![2],
                want_started: vec![1, 2],
            },
            Case {
                name: "a session first leaves the batch job short",
                gpus: 2,
                busy: vec![],
                external: vec![],
                keep: 1,
                placed: vec![(2, vec![0]), (1, vec![1])],
                sessions: vec![2],
                want_started: vec![2],
            },
            Case {
                name: "busy and outside-busy GPUs are not free",
                gpus: 4,
                busy: vec![0],
                external: vec![1],
                keep: 1,
                placed: vec![(1, vec![2, 3])],
                sessions: vec![],
                want_started: vec![],
            },
            Case {
                name: "a wide batch job fits when enough stay free",
                gpus: 4,
                busy: vec![],
                external: vec![],
                keep: 2,
                placed: vec![(1, vec![0, 1]), (2, vec![2])],
                sessions: vec![],
                want_started: vec![1],
            },
            Case {
                name: "a shared job on a GPU already taken takes nothing free",
                gpus: 2,
                busy: vec![0],
                external: vec![],
                keep: 1,
                placed: vec![(1, vec![0])],
                sessions: vec![],
                want_started: vec![1],
            },
            Case {
                name: "keep more than there are GPUs: no batch job takes a free one",
                gpus: 2,
                busy: vec![],
                external: vec![],
                keep: 5,
                placed: vec![(1, vec![0])],
                sessions: vec![],
                want_started: vec![],
            },
        ];
        for c in cases {
            let st = state(c.gpus, &c.busy, &c.external);
            let mut plan = Plan {
                placements: c
                    .placed
                    .iter()
                    .map(|(j, g)| Placement {
                        job_id: *j,
                        gpus: g.clone(),
                    })
                    .collect(),
                waiting: vec![],
                preempt: vec![],
            };
            keep_free(&mut plan, &st, &c.sessions.iter().copied().collect(), c.keep);
            let started: Vec<i64> = plan.placements.iter().map(|p| p.job_id).collect();
            assert_eq!(started, c.want_started, "{}", c.name);
            for w in &plan.waiting {
                assert_eq!(w.reason, KEPT_FREE, "{}", c.name);
                assert!(!started.contains(&w.job_id), "{}", c.name);
            }
            assert_eq!(plan.waiting.len() + started.len(), c.placed.len(), "{}", c.name);
        }
    }
}
