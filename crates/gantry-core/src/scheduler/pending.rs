//! Preemption when Slurm places the jobs (the Slurm backend): Gantry sees only its own jobs and not
//! the cluster's GPUs, so it decides by the priority rule alone. A job whose Slurm job pends for
//! resources (`Resources`, `Priority`) may preempt running preemptible jobs of this engine whose
//! priority is at least `priority_gap` below its own, with the same guard rails as on a workstation
//! ([`Victim`]: `min_run`, `max_per_day`, never for a job it was preempted for or that was preempted
//! for it, whole jobs only, the cheapest first); victims are taken until their GPUs add up to the
//! job's (Slurm then places it; Gantry does not know which node would free up). Pure: tested by a table.

use super::{Preempt, PreemptRules, PreemptWhy, RunningJob};

/// A job of this engine whose Slurm job waits for resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingJob {
    pub job_id: i64,
    pub user: String,
    pub priority: i32,
    pub gpus: u32,
}

/// The preemptions for `pending` (highest priority first) among `running` (Slurm runs them).
pub fn preempt_pending(
    now_ms: i64,
    rules: &PreemptRules,
    pending: &[PendingJob],
    running: &[RunningJob],
) -> Vec<Preempt> {
    let Some(gap) = rules.priority_gap else { return vec![] };
    let mut order: Vec<&PendingJob> = pending.iter().filter(|p| p.gpus > 0).collect();
    order.sort_by_key(|p| (std::cmp::Reverse(p.priority), p.job_id));
    let mut used: Vec<i64> = vec![];
    let mut out = vec![];
    for job in order {
        // Already served: jobs are stopping for it.
        if running
            .iter()
            .any(|r| r.victim.as_ref().is_some_and(|v| v.stopping_for == Some(job.job_id)))
        {
            continue;
        }
        let mut vs: Vec<&RunningJob> = running
            .iter()
            .filter(|r| {
                let Some(v) = &r.victim else { return false };
                !used.contains(&r.job_id)
                    && v.stopping_for.is_none()
                    && now_ms - v.started_ms >= rules.min_run_ms
                    && v.preempted_today < rules.max_per_day
                    && !v.preempted_for.contains(&job.job_id)
                    && !v.took_from.contains(&job.job_id)
                    && v.priority.saturating_add(gap) <= job.priority
                    && !r.gpus.is_empty()
            })
            .collect();
        // Cheapest first: fewest GPU-minutes this attempt, then the latest checkpoint answered.
        vs.sort_by_key(|r| {
            let v = r.victim.as_ref().expect("filtered to preemptible jobs");
            (
                (now_ms - v.started_ms).max(0) as i128 * r.gpus.len() as i128,
                std::cmp::Reverse(v.checkpoint_ms),
                r.job_id,
            )
        });
        let mut take = vec![];
        let mut gpus = 0u32;
        for r in vs {
            if gpus >= job.gpus {
                break;
            }
            gpus += r.gpus.len() as u32;
            take.push(r);
        }
        if gpus < job.gpus {
            continue;
        }
        let victim_priority = take
            .iter()
            .filter_map(|r| r.victim.as_ref().map(|v| v.priority))
            .max()
            .unwrap_or(0);
        for r in take {
            used.push(r.job_id);
            out.push(Preempt {
                job: r.job_id,
                for_job: job.job_id,
                why: PreemptWhy::Priority {
                    user: job.user.clone(),
                    gpus: job.gpus,
                    priority: job.priority,
                    victim_priority,
                },
                gpus: vec![],
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::Victim;

    const MIN: i64 = 60_000;

    fn rules() -> PreemptRules {
        PreemptRules {
            overdue: false,
            priority_gap: Some(10),
            fair_share: false,
            min_run_ms: 10 * MIN,
            max_per_day: 3,
        }
    }

    fn run(id: i64, gpus: u32, v: Option<Victim>) -> RunningJob {
        RunningJob {
            job_id: id,
            user: "ann".into(),
            gpus: (0..gpus).collect(),
            gpu_memory: None,
            expected_end_ms: None,
            needs: Default::default(),
            victim: v,
            declared: None,
        }
    }

    fn victim(priority: i32, ran_min: i64) -> Option<Victim> {
        Some(Victim {
            priority,
            started_ms: 1000 * MIN - ran_min * MIN,
            ..Default::default()
        })
    }

    fn pend(id: i64, priority: i32, gpus: u32) -> PendingJob {
        PendingJob {
            job_id: id,
            user: "bob".into(),
            priority,
            gpus,
        }
    }

    /// Each rule and guard rail: (what, rules, pending, running, the (victim, for) decided).
    #[test]
    fn preempt_pending_table() {
        let now = 1000 * MIN;
        let off = PreemptRules {
            priority_gap: None,
            ..rules()
        };
        let v = |f: fn(&mut Victim)| {
            let mut x = victim(0, 30).unwrap();
            f(&mut x);
            Some(x)
        };
        #[allow(clippy::type_complexity)] // a table test: one tuple per case reads as the table
        let rows: Vec<(&str, PreemptRules, Vec<PendingJob>, Vec<RunningJob>, Vec<(i64, i64)>)> = vec![
            (
                "the priority rule: a gap of 10",
                rules(),
                vec![pend(9, 10, 1)],
                vec![run(1, 1, victim(0, 30))],
                vec![(1, 9)],
            ),
            (
                "below the gap: nothing",
                rules(),
                vec![pend(9, 9, 1)],
                vec![run(1, 1, victim(0, 30))],
                vec![],
            ),
            (
                "the rule off: nothing",
                off,
                vec![pend(9, 100, 1)],
                vec![run(1, 1, victim(0, 30))],
                vec![],
            ),
            (
                "never a job that is not preemptible",
                rules(),
                vec![pend(9, 100, 1)],
                vec![run(1, 1, None)],
                vec![],
            ),
            (
                "not before min_run",
                rules(),
                vec![pend(9, 10, 1)],
                vec![run(1, 1, victim(0, 9))],
                vec![],
            ),
            (
                "at most max_per_day",
                rules(),
                vec![pend(9, 10, 1)],
                vec![run(1, 1, v(|x| x.preempted_today = 3))],
                vec![],
            ),
            (
                "no loop: not for the job it was preempted for",
                rules(),
                vec![pend(9, 10, 1)],
                vec![run(1, 1, v(|x| x.preempted_for = vec![9]))],
                vec![],
            ),
            (
                "no loop: not for a job preempted for it",
                rules(),
                vec![pend(9, 10, 1)],
                vec![run(1, 1, v(|x| x.took_from = vec![9]))],
                vec![],
            ),
            (
                "not one already stopping",
                rules(),
                vec![pend(9, 10, 1)],
                vec![run(1, 1, v(|x| x.stopping_for = Some(8)))],
                vec![],
            ),
            (
                "a job served already gets no more",
                rules(),
                vec![pend(9, 10, 1)],
                vec![run(1, 1, v(|x| x.stopping_for = Some(9))), run(2, 1, victim(0, 30))],
                vec![],
            ),
            (
                "the cheapest first: fewest GPU-minutes",
                rules(),
                vec![pend(9, 10, 1)],
                vec![
                    run(1, 1, victim(0, 60)),
                    run(2, 2, victim(0, 20)),
                    run(3, 1, victim(0, 30)),
                ],
                vec![(3, 9)],
            ),
            (
                "whole jobs until the GPUs add up",
                rules(),
                vec![pend(9, 10, 3)],
                vec![run(1, 2, victim(0, 60)), run(2, 2, victim(0, 20))],
                vec![(2, 9), (1, 9)],
            ),
            (
                "never partially: too few GPUs to take, nothing",
                rules(),
                vec![pend(9, 10, 4)],
                vec![run(1, 2, victim(0, 60)), run(2, 1, None)],
                vec![],
            ),
            (
                "a victim serves one job, the highest priority first",
                rules(),
                vec![pend(8, 10, 1), pend(9, 20, 1)],
                vec![run(1, 1, victim(0, 30))],
                vec![(1, 9)],
            ),
            (
                "a job without GPUs preempts nothing",
                rules(),
                vec![pend(9, 10, 0)],
                vec![run(1, 1, victim(0, 30))],
                vec![],
            ),
        ];
        for (what, r, p, running, want) in rows {
            let got: Vec<(i64, i64)> = preempt_pending(now, &r, &p, &running)
                .iter()
                .map(|d| (d.job, d.for_job))
                .collect();
            assert_eq!(got, want, "{what}");
        }
        let d = &preempt_pending(now, &rules(), &[pend(9, 10, 1)], &[run(1, 1, victim(0, 30))])[0];
        assert_eq!(d.why.to_string(), "bob's 1-GPU job has priority 10, this one 0");
    }
}
