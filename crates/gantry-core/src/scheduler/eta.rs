//! Start estimates: `plan` replayed forward on a virtual clock.

#[allow(unused_imports)]
use super::*;

/// Estimated start time of each queued job: replay `plan` forward on a virtual clock, assuming each
/// job runs for its expected runtime (`default_runtime_ms` when unknown) and nothing new arrives.
pub fn estimate_starts(
    state: &State,
    default_runtime_ms: i64,
    max_steps: usize,
) -> std::collections::HashMap<i64, i64> {
    let mut out = std::collections::HashMap::new();
    let mut s = state.clone();
    s.config.explain_first = 0;
    for r in &mut s.running {
        // Being stopped by a preemption: it ends within its checkpoint grace, not at its runtime (a job
        // waiting on it read "starts ~in 29m 59s" and started 8 s later).
        if r.victim.as_ref().is_some_and(|v| v.stopping_for.is_some()) {
            r.expected_end_ms = Some(s.now_ms + 1);
            continue;
        }
        if r.expected_end_ms.is_none_or(|e| e <= s.now_ms) {
            r.expected_end_ms = Some(s.now_ms + default_runtime_ms / 2);
        }
    }
    for _ in 0..max_steps {
        if s.queued.is_empty() {
            break;
        }
        let p = plan(&s);
        for pl in &p.placements {
            out.insert(pl.job_id, s.now_ms);
            if let Some(i) = s.queued.iter().position(|q| q.job_id == pl.job_id) {
                let q = s.queued.remove(i);
                let rt = q.expected_runtime_ms.unwrap_or(default_runtime_ms).max(1);
                s.running.push(RunningJob {
                    job_id: q.job_id,
                    user: q.user.clone(),
                    gpus: pl.gpus.clone(),
                    gpu_memory: q.gpu_memory,
                    expected_end_ms: Some(s.now_ms + rt),
                    needs: q.needs,
                    victim: None,
                    declared: None,
                });
            }
        }
        // Jump to the next end (or backoff expiry), when something can change.
        let next_end = s
            .running
            .iter()
            .filter_map(|r| r.expected_end_ms)
            .filter(|e| *e > s.now_ms)
            .min();
        let next_nb = s
            .queued
            .iter()
            .filter_map(|q| q.not_before_ms)
            .filter(|t| *t > s.now_ms)
            .min();
        let Some(next) = [next_end, next_nb].into_iter().flatten().min() else {
            break;
        };
        s.now_ms = next;
        let now = s.now_ms;
        s.running.retain(|r| r.expected_end_ms.is_some_and(|e| e > now));
    }
    out
}

#[cfg(test)]
mod estimate_tests {
    use super::*;

    #[test]
    pub(super) fn start_estimates_follow_the_running_jobs_ends() {
        let g = |i| GpuView {
            index: i,
            memory_total: 1 << 34,
            ..Default::default()
        };
        let q = |id, gpus, rt: Option<i64>| QueuedJob {
            job_id: id,
            user: String::new(),
            priority: 0,
            submitted_at_ms: id,
            gpus,
            gpu_memory: None,
            not_before_ms: None,
            expected_runtime_ms: rt,
            user_usage: 0.0,
            filter: GpuFilter::default(),
            needs: CpuRam::default(),
            preempted_at_ms: None,
        };
        let s = State {
            now_ms: 0,
            gpus: vec![g(0), g(1)],
            running: vec![RunningJob {
                job_id: 9,
                user: String::new(),
                gpus: vec![0],
                gpu_memory: None,
                expected_end_ms: Some(1_000),
                needs: CpuRam::default(),
                victim: None,
                declared: None,
            }],
            queued: vec![q(1, 1, Some(5_000)), q(2, 2, Some(100)), q(3, 1, None)],
            config: Config {
                reserve_after_ms: i64::MAX,
                ..Config::default()
            },
            typical_wait_ms: None,
            host: None,
        };
        let e = estimate_starts(&s, 60_000, 100);
        assert_eq!(e[&1], 0); // GPU 1 is free now
        assert_eq!(e[&3], 1_000); // GPU 0 frees at 1 s
        assert_eq!(e[&2], 61_000); // needs both: after job 3's assumed 60 s

        // Issue 28: a job whose GPU's holder is being preempted for it starts when that one has
        // stopped, not half a default runtime later.
        let mut s = s;
        s.gpus.truncate(1);
        s.queued.truncate(1);
        s.running[0].expected_end_ms = None;
        s.running[0].victim = Some(Victim {
            priority: 0,
            started_ms: -1,
            submitted_ms: -1,
            preempted_today: 0,
            preempted_for: vec![],
            took_from: vec![],
            checkpoint_ms: None,
            last_checkpoint_ms: None,
            stopping_for: Some(1),
        });
        assert_eq!(estimate_starts(&s, 60_000, 100)[&1], 1);
    }
}
