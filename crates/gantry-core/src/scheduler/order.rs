//! The order queued jobs are considered in: priority, fair share, and the overdue job that goes first.

#[allow(unused_imports)]
use super::*;

/// Scheduling order. Priority first (high first); then the owner's recent usage (light users
/// first). Then, when runtimes are known: "critical" jobs — those so long that starting them later
/// would stretch the whole schedule (runtime >= CRITICAL_FRACTION x the backlog per GPU) — first, then smallest work
/// (runtime x GPUs) first, which minimizes mean wait. Without runtimes: submission time. Ties: id.
pub fn order(state: &State) -> Vec<i64> {
    sorted(state).iter().map(|j| j.job_id).collect()
}

pub(super) fn sorted(state: &State) -> Vec<&QueuedJob> {
    let runtimes = state.config.use_runtimes && state.queued.iter().any(|q| q.expected_runtime_ms.is_some());
    let critical_from = if runtimes {
        backlog_per_gpu(state) as f64 * CRITICAL_FRACTION
    } else {
        f64::INFINITY
    };
    let key = |q: &QueuedJob| -> (bool, i128) {
        match q.expected_runtime_ms {
            Some(rt) if runtimes && state.config.hrrn => {
                // Highest response ratio next: (wait + work) / work, largest first.
                let work = (rt.max(1) as f64) * q.gpus.max(1) as f64;
                let wait = (state.now_ms - q.submitted_at_ms).max(0) as f64;
                (
                    (rt as f64) < critical_from,
                    -(((wait + work) / work).min(1e15) * 1e3) as i128,
                )
            }
            Some(rt) if runtimes => ((rt as f64) < critical_from, rt as i128 * q.gpus.max(1) as i128),
            _ if runtimes => (true, i128::MAX),
            _ => (true, 0),
        }
    };
    let aged = |q: &QueuedJob| state.config.age_narrow && q.gpus == 1 && overdue(state, q);
    let mut order: Vec<&QueuedJob> = state.queued.iter().collect();
    order.sort_by(|a, b| {
        b.priority
            .cmp(&a.priority)
            // An overdue job goes first even past fair share, as its reservation did before aging.
            .then(aged(b).cmp(&aged(a)))
            .then(if aged(a) && aged(b) {
                a.submitted_at_ms.cmp(&b.submitted_at_ms)
            } else {
                std::cmp::Ordering::Equal
            })
            .then(a.user_usage.total_cmp(&b.user_usage))
            .then(key(a).cmp(&key(b)))
            .then(a.submitted_at_ms.cmp(&b.submitted_at_ms))
            .then(a.job_id.cmp(&b.job_id))
    });
    order
}

/// A job whose runtime is at least this fraction of the backlog per GPU is "critical": starting it
/// later would stretch the schedule's end. Tuned on the Alibaba trace (see docs/scheduling.md).
pub(super) const CRITICAL_FRACTION: f64 = 0.25;

/// Known remaining work (GPU-ms) divided by the GPU count: how long the machine is busy if packed.
pub(super) fn backlog_per_gpu(state: &State) -> i64 {
    let queued: i128 = state
        .queued
        .iter()
        .filter_map(|q| q.expected_runtime_ms.map(|r| r as i128 * q.gpus as i128))
        .sum();
    let running: i128 = state
        .running
        .iter()
        .filter_map(|r| {
            r.expected_end_ms
                .map(|e| (e - state.now_ms).max(0) as i128 * r.gpus.len() as i128)
        })
        .sum();
    ((queued + running) / state.gpus.len().max(1) as i128) as i64
}

pub(super) fn threshold(state: &State, factor: f64) -> i64 {
    let typical = state.typical_wait_ms.map(|t| (t as f64 * factor) as i64).unwrap_or(0);
    state.config.reserve_after_ms.max(typical)
}

/// Has `q` waited long enough to reserve GPUs (2+ GPUs) or, with `age_narrow`, to go first (1 GPU)?
pub(super) fn overdue(state: &State, q: &QueuedJob) -> bool {
    let factor = if q.gpus >= 2 {
        state.config.wide_reserve_factor
    } else {
        state.config.reserve_factor
    };
    q.gpus > 0 && state.now_ms - q.waiting_since_ms() >= threshold(state, factor)
}

/// The job that has waited longest past `reserve_after_ms` (it gets the one reservation), among
/// those its owner's GPU cap lets start.
pub(super) fn starving<'a>(state: &'a State, caps: &UserCaps) -> Option<&'a QueuedJob> {
    // A drain is paid for once: while a job holding 2+ GPUs runs, the next wide job that its GPUs
    // can serve queues for them as they free (so a burst of wide jobs shares one drain).
    let widest_running = if state.config.share_drains {
        state.running.iter().map(|r| r.gpus.len() as u32).max().unwrap_or(0)
    } else {
        0
    };
    state
        .queued
        .iter()
        .filter(|q| {
            (overdue(state, q) || (q.gpus >= 2 && q.gpus <= widest_running))
                && (q.gpus >= 2 || !state.config.age_narrow)
        })
        .filter(|q| caps.over(q).is_none())
        // One that cannot start while GPUs are used outside this engine would hold a reservation
        // (and the one starving slot) for as long as that use lasts.
        .filter(|q| outside_blocks(state, q).is_none())
        .filter(|q| q.not_before_ms.is_none_or(|nb| nb <= state.now_ms))
        .min_by_key(|q| (q.submitted_at_ms, q.job_id))
}
