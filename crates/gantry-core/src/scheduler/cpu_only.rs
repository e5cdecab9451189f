//! What CPU-only jobs (`gpus: 0`) may hold of the machine's CPU and RAM (issue 33).
//!
//! The machine's CPU/RAM for jobs is split into one share per GPU plus one for CPU-only jobs. Two
//! rules keep CPU-only work from idling GPUs:
//! - **the cap**: CPU-only jobs together hold at most [`Config::cpu_only_limit`] (the lab's
//!   `[containers] cpu_only_shares`, one share by default). One CPU-only job may always run alone,
//!   up to its own ceiling, so a large one is never stuck.
//! - **the free GPUs' shares**: a CPU-only job starts only if what stays free covers the per-GPU
//!   share ([`Config::gpu_share`]) of every GPU no job holds, whatever the lab set. A CPU-only job
//!   that would be preemptible ([`Config::preemptible`], with preemption on) may take them: it is
//!   preempted for a GPU job that needs them ([`super::preempt`], the `cpu_only` rule).

use super::*;

/// Why CPU-only `job` may not start beside the CPU-only jobs that hold CPU/RAM now (`pool`), with
/// the GPUs in `slots` as this pass left them; `None`: it may. Empty when not `explain`ed.
pub(super) fn over(state: &State, pool: &Pool, slots: &[Slot], job: &QueuedJob, explain: bool) -> Option<String> {
    let free = pool.free_for(job)?;
    let n = job.needs;
    if let Some(limit) = state.config.cpu_only_limit {
        let held = pool.cpu_only;
        let past = |held: u64, n: u64, limit: u64| held > 0 && n > 0 && held.saturating_add(n) > limit;
        let cpu = past(held.cpus_milli, n.cpus_milli, limit.cpus_milli);
        if cpu || past(held.memory, n.memory, limit.memory) {
            if !explain {
                return Some(String::new());
            }
            let (what, l, h) = measure(cpu, limit, held);
            let who = holders(pool, cpu);
            return Some(format!(
                "CPU-only jobs may hold {l} {what} together here and hold {h} ({who}); the rest is the GPUs' share, \
                 kept for GPU jobs; starts when a CPU-only job ends (a lab admin may raise `cpu_only_shares` in \
                 [containers])"
            ));
        }
    }
    let preemptible = state.config.preemption.is_some() && state.config.preemptible.contains(&job.job_id);
    let share = state.config.gpu_share.filter(|_| !preemptible)?;
    let idle = slots.iter().filter(|s| s.is_empty() && !s.external).count() as u64;
    let keep = CpuRam {
        cpus_milli: share.cpus_milli.saturating_mul(idle),
        memory: share.memory.saturating_mul(idle),
    };
    let short = |n: u64, keep: u64, free: u64| n > 0 && keep > 0 && n.saturating_add(keep) > free;
    let cpu = short(n.cpus_milli, keep.cpus_milli, free.cpus_milli);
    if !cpu && !short(n.memory, keep.memory, free.memory) {
        return None;
    }
    if !explain {
        return Some(String::new());
    }
    let (what, need, f) = measure(cpu, n, free);
    let (_, one, _) = measure(cpu, share, share);
    let gpus = if idle == 1 {
        "the free GPU".to_string()
    } else {
        format!("the {idle} free GPUs")
    };
    Some(format!(
        "needs {need} {what}; the {f} free are the share of {gpus} ({one} each), kept for GPU jobs; starts \
         when CPU-only work may have it (a CPU-only job that is `preemptible: true` may take it where the lab \
         turned preemption on)"
    ))
}

/// The measure a reason is about (CPUs when `cpu`, else memory), its words (for `a`) and `a`, `b` in it.
fn measure(cpu: bool, a: CpuRam, b: CpuRam) -> (&'static str, String, String) {
    if cpu {
        let what = if a.cpus_milli == 1000 { "CPU" } else { "CPUs" };
        (what, format_cpus(a.cpus_milli), format_cpus(b.cpus_milli))
    } else {
        (
            "of memory",
            crate::units::format_bytes(a.memory),
            crate::units::format_bytes(b.memory),
        )
    }
}

/// "bob's job 22 uses 0.2; 2 more jobs": the CPU-only jobs holding the measure, largest first.
fn holders(pool: &Pool, cpu: bool) -> String {
    let pick = |c: &CpuRam| if cpu { c.cpus_milli } else { c.memory };
    let fmt = |v: u64| {
        if cpu {
            format_cpus(v)
        } else {
            crate::units::format_bytes(v)
        }
    };
    let mut by: Vec<&(&str, i64, CpuRam)> = pool.cpu_only_by.iter().filter(|h| pick(&h.2) > 0).collect();
    by.sort_by_key(|h| (std::cmp::Reverse(pick(&h.2)), h.1));
    let mut who: Vec<String> = by
        .iter()
        .take(3)
        .map(|(u, id, c)| format!("{u}'s job {id} uses {}", fmt(pick(c))))
        .collect();
    if by.len() > 3 {
        who.push(format!("{} more jobs", by.len() - 3));
    }
    who.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    const G: u64 = 1 << 30;

    fn gpus(n: u32) -> Vec<GpuView> {
        (0..n)
            .map(|i| GpuView {
                index: i,
                memory_total: 24 * G,
                ..Default::default()
            })
            .collect()
    }
    fn q(id: i64, user: &str, gpus: u32, cpus_milli: u64) -> QueuedJob {
        QueuedJob {
            job_id: id,
            user: user.into(),
            priority: 0,
            submitted_at_ms: id,
            gpus,
            gpu_memory: None,
            not_before_ms: None,
            expected_runtime_ms: None,
            user_usage: 0.0,
            filter: GpuFilter::default(),
            needs: CpuRam {
                cpus_milli,
                memory: cpus_milli * G / 1000,
            },
            preempted_at_ms: None,
        }
    }
    fn running(id: i64, user: &str, gpus: &[u32], cpus_milli: u64) -> RunningJob {
        RunningJob {
            job_id: id,
            user: user.into(),
            gpus: gpus.to_vec(),
            gpu_memory: None,
            expected_end_ms: None,
            needs: CpuRam {
                cpus_milli,
                memory: cpus_milli * G / 1000,
            },
            victim: None,
            declared: None,
        }
    }
    /// 4 GPUs, 1 CPU and 1 GiB for jobs: each of the 5 equal shares is 0.2 CPUs and 0.2 GiB.
    fn st(running: Vec<RunningJob>, queued: Vec<QueuedJob>, shares: u64) -> State {
        let share = CpuRam {
            cpus_milli: 200,
            memory: G / 5,
        };
        State {
            now_ms: 1_000,
            gpus: gpus(4),
            running,
            queued,
            config: Config {
                gpu_share: Some(share),
                cpu_only_limit: Some(CpuRam {
                    cpus_milli: 200 * shares,
                    memory: G / 5 * shares,
                }),
                ..Config::default()
            },
            typical_wait_ms: None,
            host: Some(CpuRam {
                cpus_milli: 1000,
                memory: G,
            }),
        }
    }
    fn placed(p: &Plan) -> Vec<i64> {
        p.placements.iter().map(|p| p.job_id).collect()
    }
    fn why(p: &Plan, id: i64) -> String {
        p.waiting
            .iter()
            .find(|w| w.job_id == id)
            .map(|w| w.reason.clone())
            .unwrap_or_default()
    }

    /// Issue 33's scenario and the rules around it, as a table: (case, running, queued, lab shares,
    /// preemption on with these queued jobs preemptible, jobs that start).
    #[test]
    fn cpu_only_jobs_hold_their_share_and_never_a_free_gpus() {
        let six: Vec<QueuedJob> = (1..=6).map(|i| q(i, "bob", 0, 200)).collect();
        let alice = q(7, "alice", 1, 200);
        type Case = (
            &'static str,
            Vec<RunningJob>,
            Vec<QueuedJob>,
            u64,
            Option<Vec<i64>>,
            Vec<i64>,
        );
        let cases: Vec<Case> = vec![
            (
                "six CPU-only jobs on an idle machine: one starts (the CPU-only share)",
                vec![],
                six.clone(),
                1,
                None,
                vec![1],
            ),
            (
                "then alice's 1-GPU job starts beside it",
                vec![running(1, "bob", &[], 200)],
                [six[1..].to_vec(), vec![alice.clone()]].concat(),
                1,
                None,
                vec![7],
            ),
            (
                "a lab allowing 3 shares still keeps every free GPU's share",
                vec![],
                six.clone(),
                3,
                None,
                vec![1],
            ),
            (
                "3 shares: with 2 GPUs busy, CPU-only work takes what the busy GPUs' jobs left",
                vec![running(8, "carl", &[0], 100), running(9, "carl", &[1], 100)],
                six.clone(),
                3,
                None,
                vec![1, 2],
            ),
            (
                "a preemptible CPU-only job may take free GPUs' shares (preemption on), up to the cap",
                vec![],
                six.clone(),
                3,
                Some(vec![1, 2, 3, 4, 5, 6]),
                vec![1, 2, 3],
            ),
            (
                "a large CPU-only job alone may run up to its ceiling; none joins it past the cap",
                vec![running(1, "bob", &[], 200)],
                vec![q(2, "bob", 0, 100)],
                1,
                None,
                vec![],
            ),
            (
                "a CPU-only job asking for no CPU/RAM (the lab counts none) is never held back",
                vec![running(1, "bob", &[], 200)],
                vec![q(2, "bob", 0, 0)],
                1,
                None,
                vec![2],
            ),
        ];
        for (name, run, queued, shares, preemptible, want) in cases {
            let mut s = st(run, queued, shares);
            if let Some(p) = preemptible {
                s.config.preemption = Some(PreemptRules::default());
                s.config.preemptible = p;
            }
            assert_eq!(placed(&plan(&s)), want, "{name}");
        }
    }

    /// What a preemption freed is kept for the job it was freed for: its CPU/RAM as well as its GPUs
    /// (the preempted CPU-only job, queued again ahead of it, does not take the CPU back).
    #[test]
    fn the_cpu_a_preemption_freed_is_kept_for_the_job_it_was_freed_for() {
        let bobs: Vec<RunningJob> = (1..=4).map(|i| running(i, "bob", &[], 200)).collect();
        let mut s = st(bobs, vec![q(5, "bob", 0, 200), q(7, "alice", 1, 200)], 5);
        s.config.preemption = Some(PreemptRules::default());
        s.config.preemptible = vec![5];
        s.config.claims = vec![(7, vec![0])];
        let p = plan(&s);
        assert_eq!(placed(&p), vec![7]);
        assert!(
            why(&p, 5).ends_with("(bob's job 1 uses 0.2; bob's job 2 uses 0.2; bob's job 3 uses 0.2; 1 more jobs; 0.2 kept for alice's job 7, which preempted for it)"),
            "{}",
            why(&p, 5)
        );
        s.config.claims = vec![];
        assert_eq!(placed(&plan(&s)), vec![5], "without the claim, first come");
    }

    #[test]
    fn a_cpu_only_job_past_the_rules_says_why_and_what_to_change() {
        let s = st(
            vec![running(1, "bob", &[], 200)],
            (2..=6).map(|i| q(i, "bob", 0, 200)).collect(),
            1,
        );
        assert_eq!(
            why(&plan(&s), 2),
            "CPU-only jobs may hold 0.2 CPUs together here and hold 0.2 (bob's job 1 uses 0.2); the rest is the \
             GPUs' share, kept for GPU jobs; starts when a CPU-only job ends (a lab admin may raise \
             `cpu_only_shares` in [containers])"
        );
        let s = st(vec![], vec![q(2, "bob", 0, 300)], 3);
        assert_eq!(
            why(&plan(&s), 2),
            "needs 0.3 CPUs; the 1 free are the share of the 4 free GPUs (0.2 each), kept for GPU jobs; \
             starts when CPU-only work may have it (a CPU-only job that is `preemptible: true` may take it where \
             the lab turned preemption on)"
        );
    }
}
