//! "Will start by preempting": a waiting job (an interactive session, say) that no rule lets preempt
//! anyone *now* only because its would-be victims have not run the lab's `min_run` yet is told so in
//! its reason, with when. The preemption decision itself stays [`super::preempt::decide`]'s: this
//! module asks it again, on copies, at the moments those victims become eligible, and only words
//! what it would do (nothing here stops a job or holds a GPU).

use super::preempt::{decide, Preempt, PreemptRules};
use super::{Ctx, Plan, Pool, Slot, State};

/// Moments (at most this many, the earliest) at which the decision is asked again: each one a
/// would-be victim reaching `min_run`. Bounds the extra work per pass.
const LOOKS: usize = 3;

/// After `decide` ran on `slots`/`out` (given here as they were before it: `slots_before`,
/// `out_before`), add to the reason of each explained waiting job that got no victims why it will
/// preempt later, where a decision at a later moment would preempt for it.
#[allow(clippy::too_many_arguments)] // the decision's own inputs, passed through unchanged
pub(super) fn say_will_preempt(
    state: &State,
    rules: &PreemptRules,
    slots_before: &[Slot],
    out_before: &Plan,
    pool: &Pool,
    ctx: &Ctx,
    starving: Option<i64>,
    out: &mut Plan,
) {
    let now = state.now_ms;
    let mut times: Vec<i64> = state
        .running
        .iter()
        .filter_map(|r| r.victim.as_ref())
        .filter(|v| v.stopping_for.is_none())
        .map(|v| v.started_ms.saturating_add(rules.min_run_ms))
        .filter(|t| *t > now)
        .collect();
    times.sort_unstable();
    times.dedup();
    times.truncate(LOOKS);
    // The explained waiting jobs with GPUs to get and nothing preempted or stopping for them.
    let deciding = |id: i64| {
        out.preempt.iter().any(|p| p.for_job == id)
            || state
                .running
                .iter()
                .any(|r| r.victim.as_ref().is_some_and(|v| v.stopping_for == Some(id)))
    };
    let mut open: Vec<i64> = out
        .waiting
        .iter()
        .filter(|w| !w.reason.is_empty() && !deciding(w.job_id))
        .filter(|w| state.queued.iter().any(|q| q.job_id == w.job_id && q.gpus > 0))
        .map(|w| w.job_id)
        .collect();
    if times.is_empty() || open.is_empty() {
        return;
    }
    // Only the explained head of the queue is asked about: a decision for a job depends only on
    // the jobs before it.
    let head = out_before
        .waiting
        .iter()
        .rposition(|w| open.contains(&w.job_id))
        .map_or(0, |i| i + 1);
    for t in times {
        let later = State {
            now_ms: t,
            ..state.clone()
        };
        let lctx = Ctx {
            now: t,
            topology: ctx.topology.clone(),
            ..*ctx
        };
        let mut lslots = slots_before.to_vec();
        let mut lout = Plan {
            placements: out_before.placements.clone(),
            waiting: out_before.waiting[..head].to_vec(),
            preempt: out_before.preempt.clone(),
        };
        decide(&later, rules, &mut lslots, pool, &lctx, starving, &mut lout);
        open.retain(|&id| {
            let take: Vec<&Preempt> = lout.preempt.iter().filter(|p| p.for_job == id).collect();
            let Some(first) = take.first() else { return true };
            if let Some(w) = out.waiting.iter_mut().find(|w| w.job_id == id) {
                w.reason = format!(
                    "{}; {}",
                    w.reason,
                    will_preempt(&take, &first.why, t - now, rules.min_run_ms)
                );
            }
            false
        });
        if open.is_empty() {
            break;
        }
    }
}

/// "will start by preempting job 8 (preemptible; …) in ~4 min, once it has run the lab's minimum of 10m".
/// The wait is in whole minutes (rounded up), so the reason, which a waiting `gantry shell` prints each
/// time it changes, changes at most once a minute.
fn will_preempt(take: &[&Preempt], why: &impl std::fmt::Display, in_ms: i64, min_run_ms: i64) -> String {
    let names = take.iter().map(|p| p.job.to_string()).collect::<Vec<_>>().join(", ");
    let one = take.len() == 1;
    let when = if in_ms < 60_000 {
        "under a minute".to_string()
    } else {
        format!(
            "~{}",
            crate::units::duration_words_ms((in_ms + 59_999) / 60_000 * 60_000)
        )
    };
    format!(
        "will start by preempting job{} {names} (preemptible; {why}) in {when}, once {} run the lab's minimum of {} (`[preemption] min_run`)",
        if one { "" } else { "s" },
        if one { "it has" } else { "they have" },
        crate::units::duration_ms(min_run_ms)
    )
}

#[cfg(test)]
mod tests {
    use super::super::*;

    const M: i64 = 60_000;

    fn state(now: i64, running: Vec<RunningJob>, queued: Vec<QueuedJob>) -> State {
        State {
            now_ms: now,
            gpus: (0..2)
                .map(|i| GpuView {
                    index: i,
                    memory_total: 32 << 30,
                    ..Default::default()
                })
                .collect(),
            running,
            queued,
            config: Config {
                preemption: Some(PreemptRules::default()),
                ..Config::default()
            },
            typical_wait_ms: None,
            host: None,
        }
    }

    fn batch(id: i64, gpu: u32, started: i64) -> RunningJob {
        RunningJob {
            job_id: id,
            user: "bob".into(),
            gpus: vec![gpu],
            gpu_memory: None,
            expected_end_ms: None,
            needs: CpuRam::default(),
            victim: Some(Victim {
                started_ms: started,
                ..Default::default()
            }),
            declared: None,
        }
    }

    fn session(id: i64, at: i64) -> QueuedJob {
        QueuedJob {
            job_id: id,
            user: "ana".into(),
            priority: SESSION_PRIORITY,
            submitted_at_ms: at,
            gpus: 1,
            gpu_memory: None,
            not_before_ms: None,
            expected_runtime_ms: None,
            user_usage: 0.0,
            filter: GpuFilter::default(),
            needs: CpuRam::default(),
            preempted_at_ms: None,
        }
    }

    #[test]
    fn a_waiting_session_says_which_job_it_will_preempt_and_when() {
        // Two preemptible batch jobs started 4 and 7 minutes ago (the lab's min_run is 10m): no one is
        // preempted yet; the session names the one that reaches min_run first, in 3 minutes.
        let now = 100 * M;
        let s = state(
            now,
            vec![batch(7, 0, now - 4 * M), batch(8, 1, now - 7 * M)],
            vec![session(20, now - M)],
        );
        let p = plan(&s);
        assert!(p.preempt.is_empty(), "{:?}", p.preempt);
        let reason = &p.waiting[0].reason;
        assert!(
            reason.ends_with(
                "; will start by preempting job 8 (preemptible; ana's 1-GPU interactive session) in ~3 min, once it has run the lab's minimum of 10m (`[preemption] min_run`)"
            ),
            "{reason}"
        );
        // Three minutes later it does, as it said.
        let later = State {
            now_ms: now + 3 * M,
            ..s
        };
        let p = plan(&later);
        assert_eq!(
            p.preempt.iter().map(|x| (x.job, x.for_job)).collect::<Vec<_>>(),
            [(8, 20)]
        );
        assert!(
            !p.waiting[0].reason.contains("will start by"),
            "{}",
            p.waiting[0].reason
        );
    }

    #[test]
    fn a_job_no_rule_lets_preempt_says_nothing_of_preempting() {
        // A batch job of priority 0 may not preempt a priority-0 job (the priority rule), ever.
        let now = 100 * M;
        let mut q = session(20, now - M);
        q.priority = 0;
        let p = plan(&state(
            now,
            vec![batch(7, 0, now - 4 * M), batch(8, 1, now - 7 * M)],
            vec![q],
        ));
        assert!(!p.waiting[0].reason.contains("preempting"), "{}", p.waiting[0].reason);
    }
}
