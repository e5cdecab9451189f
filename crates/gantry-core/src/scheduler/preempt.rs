//! Preemption: which running jobs to stop (and requeue) so that a waiting job can start.
//!
//! Three rules, each only over running jobs that are preemptible ([`RunningJob::victim`]):
//! - **overdue**: the job that waited longest past `reserve_after` among the wide ones (2+ GPUs:
//!   their wait is a drain) and the one [`starving`] job, when its GPUs are held only by
//!   preemptible jobs (one such job per pass);
//! - **priority**: a job whose priority is at least `priority_gap` above the victim's;
//! - **fair share**: a user holding fewer GPUs than their share (the GPUs divided among the users
//!   with jobs running or waiting) waits while a user above their share holds preemptible GPUs.
//! - **overrun** (on whenever preemption is): a job holding a reservation preempts the preemptible
//!   jobs on its reserved GPUs that ran past their declared runtime by the margin ([`overran_ms`]):
//!   `min_run` does not protect them (their own promise was shorter), the other guard rails do.
//!
//! Guard rails, for every rule: a victim has run at least `min_run` this attempt and was preempted
//! fewer than `max_per_day` times in the last day; the cheapest victims go first (fewest GPU-minutes
//! since their start, then the most recent checkpoint signal answered); a job is stopped whole or
//! not at all; never for a job it preempted itself (no A-preempts-B-preempts-A loop), never for a
//! lower-priority job; a preempted job's wait toward the overdue rule starts again when it is
//! requeued; and only when the waiting job then fits (GPUs, CPU, RAM).

#[allow(unused_imports)]
use super::*;

/// The lab's preemption rules (`[preemption]`). In [`Config::preemption`]; `None` = off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreemptRules {
    /// The overdue rule: a job past its reservation threshold may preempt.
    pub overdue: bool,
    /// The priority rule: a job at least this much above a victim's priority may preempt it.
    pub priority_gap: Option<i32>,
    /// The fair-share rule.
    pub fair_share: bool,
    /// A job runs at least this long per attempt before it may be preempted.
    pub min_run_ms: i64,
    /// A job is preempted at most this many times in a day.
    pub max_per_day: u32,
}

impl Default for PreemptRules {
    fn default() -> Self {
        // Fair share off: on the lab-week trace (1-2 h jobs) it cost 29-32% of the GPU-hours with
        // 30-minute checkpoints (docs/scheduling.md).
        PreemptRules {
            overdue: true,
            priority_gap: Some(crate::defaults::PRIORITY_GAP),
            fair_share: false,
            min_run_ms: 10 * 60_000,
            max_per_day: 3,
        }
    }
}

/// What preemption needs to know of a preemptible running job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Victim {
    pub priority: i32,
    /// When this attempt started.
    pub started_ms: i64,
    /// Times it was preempted in the last 24 hours.
    pub preempted_today: u32,
    /// The jobs it was preempted for, earlier: those it may not preempt now (no loop).
    #[serde(default)]
    pub preempted_for: Vec<i64>,
    /// The jobs that were preempted so that it could start: they may not preempt it (no loop).
    #[serde(default)]
    pub took_from: Vec<i64>,
    /// When it last answered a checkpoint signal (exited within its grace), if ever.
    #[serde(default)]
    pub checkpoint_ms: Option<i64>,
    /// It is being stopped already, for this job: not decided again; its GPUs count as freeing.
    #[serde(default)]
    pub stopping_for: Option<i64>,
}

/// What the engine adds to an interactive session's priority while the lab puts sessions before
/// batch jobs (`[sessions] before_batch`): far above any priority a user may set (the lab's range is
/// bounded), so a session is ordered first and, under the priority rule, may preempt preemptible
/// batch jobs (a session itself is never preemptible).
pub const SESSION_PRIORITY: i32 = 1 << 30;

/// Why a job is preempted. Grows a case per trigger (interactive sessions and bookings next).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum PreemptWhy {
    /// The waiting job waited past `reserve_after`.
    Overdue { user: String, gpus: u32, waited_ms: i64 },
    /// The waiting job's priority is at least the lab's gap above the victim's.
    Priority {
        user: String,
        gpus: u32,
        priority: i32,
        victim_priority: i32,
    },
    /// The waiting job's owner holds fewer GPUs than their share, the victim's owner more.
    FairShare {
        user: String,
        gpus: u32,
        held: u32,
        share: u32,
        victim_user: String,
    },
    /// A GPU booking started on the victim's GPUs (`for_job` is 0: no job).
    Booking { user: String, booking: i64, span: String },
    /// The victim ran past its declared runtime by more than the margin, on GPUs reserved for the
    /// waiting job (its promise let the reservation's drain be planned around it, or backfilled it).
    Overran {
        job: i64,
        past_ms: i64,
        declared_ms: i64,
        user: String,
        gpus: u32,
    },
}

impl std::fmt::Display for PreemptWhy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shape = |g: &u32| {
            if *g == 1 {
                "1-GPU".to_string()
            } else {
                format!("{g}-GPU")
            }
        };
        match self {
            PreemptWhy::Overdue { user, gpus, waited_ms } => write!(
                f,
                "{user}'s {} job waited {}",
                shape(gpus),
                crate::units::duration_ms(*waited_ms)
            ),
            // A session's priority carries the engine's boost (`[sessions] before_batch`).
            PreemptWhy::Priority {
                user, gpus, priority, ..
            } if *priority >= SESSION_PRIORITY / 2 => write!(f, "{user}'s {} interactive session", shape(gpus)),
            PreemptWhy::Priority {
                user,
                gpus,
                priority,
                victim_priority,
            } => write!(
                f,
                "{user}'s {} job has priority {priority}, this one {victim_priority}",
                shape(gpus)
            ),
            PreemptWhy::FairShare {
                user,
                gpus,
                held,
                share,
                victim_user,
            } => {
                write!(
                    f,
                    "{user}'s {} job: {user} holds {held} of a fair share of {share} GPUs, {victim_user} more",
                    shape(gpus)
                )
            }
            PreemptWhy::Booking { user, booking, span } => write!(f, "{user}'s booking {booking} ({span})"),
            PreemptWhy::Overran {
                job,
                past_ms,
                declared_ms,
                user,
                gpus,
            } => write!(
                f,
                "job {job} ran {} past its declared {} runtime, on GPUs reserved for {user}'s {} job",
                crate::units::duration_ms(*past_ms),
                crate::units::duration_ms(*declared_ms),
                shape(gpus)
            ),
        }
    }
}

/// A decision: stop `job` (all of it), requeue it at its place, so that `for_job` can start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preempt {
    pub job: i64,
    pub for_job: i64,
    pub why: PreemptWhy,
    /// Every GPU `for_job` will start on: the victims' and any free ones it needs beside them. All of
    /// them are kept for it until it starts, so the job preempted for it cannot come straight back
    /// on a free one it needs (a 2-GPU job preempting a 1-GPU job on a 2-GPU machine).
    #[serde(default)]
    pub gpus: Vec<u32>,
}

impl QueuedJob {
    /// Since when it waits toward a reservation or a preemption: its submission, or its last preemption.
    pub fn waiting_since_ms(&self) -> i64 {
        self.preempted_at_ms
            .map_or(self.submitted_at_ms, |p| p.max(self.submitted_at_ms))
    }
}

/// Free `r`'s GPUs in `slots` (as if it had ended).
fn release(slots: &mut [Slot], r: &RunningJob) {
    for s in slots.iter_mut().filter(|s| r.gpus.contains(&s.index)) {
        match r.gpu_memory {
            None => {
                if s.exclusive_by == Some(r.job_id) {
                    s.exclusive_by = None;
                    s.measured_used = s.outside_used;
                }
            }
            Some(m) => {
                if let Some(i) = s.shared_jobs.iter().position(|j| *j == r.job_id) {
                    s.shared_jobs.remove(i);
                    s.shared_declared = s.shared_declared.saturating_sub(m);
                    s.measured_used = s.measured_used.saturating_sub(m);
                }
            }
        }
    }
}

/// GPUs each user holds now (placements of this pass included), and the fair share of each.
struct Shares<'a> {
    held: std::collections::BTreeMap<&'a str, u32>,
    share: u32,
}

impl<'a> Shares<'a> {
    fn new(state: &'a State, out: &Plan) -> Self {
        let mut held: std::collections::BTreeMap<&str, u32> = std::collections::BTreeMap::new();
        for r in &state.running {
            *held.entry(r.user.as_str()).or_default() += r.gpus.len() as u32;
        }
        for p in &out.placements {
            if let Some(q) = state.queued.iter().find(|q| q.job_id == p.job_id) {
                *held.entry(q.user.as_str()).or_default() += p.gpus.len() as u32;
            }
        }
        let mut users: std::collections::BTreeSet<&str> =
            held.iter().filter(|(_, n)| **n > 0).map(|(u, _)| *u).collect();
        users.extend(state.queued.iter().filter(|q| q.gpus > 0).map(|q| q.user.as_str()));
        let share = state.gpus.len() as u32 / users.len().max(1) as u32;
        Shares { held, share }
    }
    fn of(&self, user: &str) -> u32 {
        self.held.get(user).copied().unwrap_or(0)
    }
}

/// Decide preemptions for the jobs left waiting in `out` (in scheduling order), after this pass's
/// placements (`slots`, `pool`). Each waiting job gets at most one set of victims; a victim serves
/// one job. The job's GPUs stay reserved for it while its victims stop.
pub(super) fn decide(
    state: &State,
    rules: &PreemptRules,
    slots: &mut [Slot],
    pool: &Pool,
    ctx: &Ctx,
    starving: Option<i64>,
    out: &mut Plan,
) {
    let now = state.now_ms;
    let mut shares = Shares::new(state, out);
    // The overdue rule serves one job per pass: the one that has waited longest past `reserve_after`
    // among the wide ones (their wait is a drain, which preemption ends) and the one starving job.
    let overdue_pick = rules
        .overdue
        .then(|| {
            out.waiting
                .iter()
                .filter_map(|w| state.queued.iter().find(|q| q.job_id == w.job_id))
                .filter(|q| {
                    q.gpus > 0
                        && (q.gpus >= 2 || starving == Some(q.job_id))
                        && q.not_before_ms.is_none_or(|nb| nb <= now)
                })
                .filter(|q| now - q.waiting_since_ms() >= state.config.reserve_after_ms)
                .filter(|q| outside_blocks(state, q).is_none())
                .min_by_key(|q| (q.waiting_since_ms(), q.job_id))
                .map(|q| q.job_id)
        })
        .flatten();
    let mut used: Vec<i64> = state
        .running
        .iter()
        .filter(|r| r.victim.as_ref().is_some_and(|v| v.stopping_for.is_some()))
        .map(|r| r.job_id)
        .collect();
    for w in 0..out.waiting.len() {
        let id = out.waiting[w].job_id;
        let Some(job) = state.queued.iter().find(|q| q.job_id == id) else {
            continue;
        };
        if job.gpus == 0 || job.not_before_ms.is_some_and(|nb| nb > now) {
            continue;
        }
        if let Some(cap) = state.config.max_running_gpus_per_user {
            if shares.of(&job.user) + job.gpus > cap {
                continue;
            }
        }
        // Jobs already stopping for this one free their GPUs first.
        let mut trial = slots.to_vec();
        for s in trial.iter_mut().filter(|s| s.reserved_by.is_some_and(|r| r.0 == id)) {
            s.reserved_by = None;
        }
        let stopping: Vec<&RunningJob> = state
            .running
            .iter()
            .filter(|r| r.victim.as_ref().is_some_and(|v| v.stopping_for == Some(id)))
            .collect();
        for r in &stopping {
            release(&mut trial, r);
        }
        if !stopping.is_empty() && choose(&trial, job, ctx, false).is_ok() {
            let names = stopping
                .iter()
                .map(|r| r.job_id.to_string())
                .collect::<Vec<_>>()
                .join(", ");
            let gpus: Vec<u32> = stopping.iter().flat_map(|r| r.gpus.iter().copied()).collect();
            hold(slots, &gpus, id);
            let plural = if stopping.len() == 1 { "" } else { "s" };
            out.waiting[w].reason = format!(
                "starts when job{plural} {names} {} stopped (preempted for it)",
                if stopping.len() == 1 { "has" } else { "have" }
            );
            out.waiting[w].reserved = gpus;
            continue;
        }
        let waited = now - job.waiting_since_ms();
        let guarded = |r: &&RunningJob, min_run: i64| -> bool {
            let Some(v) = &r.victim else { return false };
            !used.contains(&r.job_id)
                && v.stopping_for.is_none()
                && now - v.started_ms >= min_run
                && v.preempted_today < rules.max_per_day
                && !v.preempted_for.contains(&id)
                && !v.took_from.contains(&id)
                && v.priority <= job.priority
        };
        let eligible = |r: &&RunningJob| guarded(r, rules.min_run_ms);
        // The rules, in turn: each names its victims and why.
        let mut tried: Vec<(Vec<&RunningJob>, PreemptWhy)> = vec![];
        // Overrun first: the jobs on its reserved GPUs that broke their runtime promise.
        let reserved = out.waiting[w].reserved.clone();
        let margin = state.config.overrun_margin_ms;
        let liars: Vec<&RunningJob> = state
            .running
            .iter()
            .filter(|r| r.gpus.iter().any(|g| reserved.contains(g)) && overran_ms(r, now, margin).is_some())
            .filter(|r| guarded(r, 0))
            .collect();
        if let Some(first) = liars.first() {
            tried.push((liars.clone(), overran_why(first, job, now, margin)));
        }
        if let Some(gap) = rules.priority_gap {
            let vs: Vec<&RunningJob> = state
                .running
                .iter()
                .filter(eligible)
                .filter(|r| {
                    r.victim
                        .as_ref()
                        .is_some_and(|v| v.priority.saturating_add(gap) <= job.priority)
                })
                .collect();
            if !vs.is_empty() {
                let vp = vs
                    .iter()
                    .filter_map(|r| r.victim.as_ref().map(|v| v.priority))
                    .max()
                    .unwrap_or(0);
                tried.push((
                    vs,
                    PreemptWhy::Priority {
                        user: job.user.clone(),
                        gpus: job.gpus,
                        priority: job.priority,
                        victim_priority: vp,
                    },
                ));
            }
        }
        if overdue_pick == Some(id) {
            let vs: Vec<&RunningJob> = state.running.iter().filter(eligible).collect();
            if !vs.is_empty() {
                tried.push((
                    vs,
                    PreemptWhy::Overdue {
                        user: job.user.clone(),
                        gpus: job.gpus,
                        waited_ms: waited,
                    },
                ));
            }
        }
        if rules.fair_share && shares.of(&job.user) + job.gpus <= shares.share {
            // The victim's owner stays at or above the share: it cannot preempt back.
            let vs: Vec<&RunningJob> = state
                .running
                .iter()
                .filter(eligible)
                .filter(|r| r.user != job.user && shares.of(&r.user) >= shares.share + r.gpus.len() as u32)
                .collect();
            if !vs.is_empty() {
                let vu = vs[0].user.clone();
                tried.push((
                    vs,
                    PreemptWhy::FairShare {
                        user: job.user.clone(),
                        gpus: job.gpus,
                        held: shares.of(&job.user),
                        share: shares.share,
                        victim_user: vu,
                    },
                ));
            }
        }
        for (mut vs, why) in tried {
            // Cheapest first: fewest GPU-minutes this attempt, then the latest checkpoint answered.
            vs.sort_by_key(|r| {
                let v = r.victim.as_ref().expect("eligible victims are preemptible");
                (
                    (now - v.started_ms).max(0) as i128 * r.gpus.len() as i128,
                    std::cmp::Reverse(v.checkpoint_ms),
                    r.job_id,
                )
            });
            let mut fair = shares.held.clone();
            let mut take: Vec<&RunningJob> = vec![];
            let mut t = trial.clone();
            let fits =
                |t: &[Slot], take: &[&RunningJob]| choose(t, job, ctx, false).is_ok() && cpu_fits(pool, job, take);
            for r in vs {
                if matches!(why, PreemptWhy::FairShare { .. }) {
                    // Each victim's owner must stay at or above the share after the ones taken so far.
                    let h = fair.get(r.user.as_str()).copied().unwrap_or(0);
                    if h < shares.share + r.gpus.len() as u32 {
                        continue;
                    }
                    fair.insert(r.user.as_str(), h - r.gpus.len() as u32);
                }
                release(&mut t, r);
                take.push(r);
                if fits(&t, &take) {
                    break;
                }
            }
            if take.is_empty() || !fits(&t, &take) {
                continue;
            }
            // Drop victims that turned out not to be needed (latest first).
            for i in (0..take.len()).rev() {
                let mut rest = take.clone();
                rest.remove(i);
                let mut t2 = trial.clone();
                for r in &rest {
                    release(&mut t2, r);
                }
                if !rest.is_empty() && fits(&t2, &rest) {
                    take = rest;
                }
            }
            // Where it will start once they stopped: their GPUs and any free ones beside them.
            let mut after = trial.clone();
            for r in &take {
                release(&mut after, r);
            }
            let target = choose(&after, job, ctx, false).unwrap_or_default();
            let gpus: Vec<u32> = take
                .iter()
                .flat_map(|r| r.gpus.iter().copied())
                .chain(stopping.iter().flat_map(|r| r.gpus.iter().copied()))
                .chain(target)
                .collect();
            let gpus = sorted_gpus(gpus);
            hold(slots, &gpus, id);
            for r in &take {
                used.push(r.job_id);
                *shares.held.entry(r.user.as_str()).or_default() -= r.gpus.len() as u32;
                // Each overrunning victim is named with its own overrun.
                let why = if matches!(why, PreemptWhy::Overran { .. }) {
                    overran_why(r, job, now, state.config.overrun_margin_ms)
                } else {
                    why.clone()
                };
                out.preempt.push(Preempt {
                    job: r.job_id,
                    for_job: id,
                    why,
                    gpus: gpus.clone(),
                });
            }
            *shares.held.entry(job.user.as_str()).or_default() += job.gpus;
            let names = take.iter().map(|r| r.job_id.to_string()).collect::<Vec<_>>().join(", ");
            out.waiting[w].reason = format!(
                "preempting job{} {names} for it ({why}); starts when {} stopped",
                if take.len() == 1 { "" } else { "s" },
                if take.len() == 1 { "it has" } else { "they have" }
            );
            out.waiting[w].reserved = sorted_gpus(gpus);
            break;
        }
    }
}

/// Why `r` (past its declared runtime) is preempted for `job`.
fn overran_why(r: &RunningJob, job: &QueuedJob, now: i64, margin: i64) -> PreemptWhy {
    PreemptWhy::Overran {
        job: r.job_id,
        past_ms: overran_ms(r, now, margin).unwrap_or(0),
        declared_ms: r.declared.map_or(0, |d| d.runtime_ms),
        user: job.user.clone(),
        gpus: job.gpus,
    }
}

/// Its CPU and RAM fit once `take` stop.
fn cpu_fits(pool: &Pool, job: &QueuedJob, take: &[&RunningJob]) -> bool {
    let Some(free) = pool.free else { return true };
    let cpus = free.cpus_milli + take.iter().map(|r| r.needs.cpus_milli).sum::<u64>();
    let mem = free.memory + take.iter().map(|r| r.needs.memory).sum::<u64>();
    job.needs.cpus_milli <= cpus && job.needs.memory <= mem
}

/// Keep `gpus` for `job` while they free (no one else may take them meanwhile).
fn hold(slots: &mut [Slot], gpus: &[u32], job: i64) {
    for s in slots.iter_mut().filter(|s| gpus.contains(&s.index)) {
        s.reserved_by = Some((job, None));
    }
}

fn sorted_gpus(mut g: Vec<u32>) -> Vec<u32> {
    g.sort();
    g.dedup();
    g
}

#[cfg(test)]
mod tests {
    use super::*;
    const G: u64 = 1 << 30;
    const M: i64 = 60_000;
    const H: i64 = 60 * M;

    fn gpus(n: u32) -> Vec<GpuView> {
        (0..n)
            .map(|i| GpuView {
                index: i,
                memory_total: 32 * G,
                ..Default::default()
            })
            .collect()
    }
    fn q(id: i64, user: &str, gpus: u32, prio: i32, at: i64) -> QueuedJob {
        QueuedJob {
            job_id: id,
            user: user.into(),
            priority: prio,
            submitted_at_ms: at,
            gpus,
            gpu_memory: None,
            not_before_ms: None,
            expected_runtime_ms: None,
            user_usage: 0.0,
            filter: GpuFilter::default(),
            needs: CpuRam::default(),
            preempted_at_ms: None,
        }
    }
    /// A preemptible job on `gpus` that started at `started`, priority 0.
    fn pre(id: i64, user: &str, gpus: &[u32], started: i64) -> RunningJob {
        RunningJob {
            job_id: id,
            user: user.into(),
            gpus: gpus.to_vec(),
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
    fn fixed(id: i64, user: &str, gpus: &[u32]) -> RunningJob {
        RunningJob {
            victim: None,
            ..pre(id, user, gpus, 0)
        }
    }
    fn with(r: RunningJob, f: impl FnOnce(&mut Victim)) -> RunningJob {
        let mut r = r;
        f(r.victim.as_mut().unwrap());
        r
    }
    fn st(n: u32, running: Vec<RunningJob>, queued: Vec<QueuedJob>, now: i64, rules: PreemptRules) -> State {
        State {
            now_ms: now,
            gpus: gpus(n),
            running,
            queued,
            config: Config {
                reserve_after_ms: H,
                preemption: Some(rules),
                ..Config::default()
            },
            typical_wait_ms: None,
            host: None,
        }
    }
    fn only_overdue() -> PreemptRules {
        PreemptRules {
            overdue: true,
            priority_gap: None,
            fair_share: false,
            ..Default::default()
        }
    }
    fn only_priority(gap: i32) -> PreemptRules {
        PreemptRules {
            overdue: false,
            priority_gap: Some(gap),
            fair_share: false,
            ..Default::default()
        }
    }
    fn only_fair() -> PreemptRules {
        PreemptRules {
            overdue: false,
            priority_gap: None,
            fair_share: true,
            ..Default::default()
        }
    }
    fn decisions(s: &State) -> Vec<(i64, i64)> {
        let mut v: Vec<(i64, i64)> = plan(s).preempt.iter().map(|p| (p.job, p.for_job)).collect();
        v.sort();
        v
    }

    #[test]
    fn preemption_rules_and_guard_rails() {
        struct Case {
            name: &'static str,
            state: State,
            /// (victim, for job)
            want: Vec<(i64, i64)>,
        }
        let now = 10 * H;
        let two_pre = || vec![pre(7, "bob", &[0], 0), pre(8, "bob", &[1], 0)];
        let cases = vec![
            // The overdue rule.
            Case { name: "overdue: a 2-GPU job past reserve_after preempts the two preemptible jobs holding its GPUs", state: st(2, two_pre(), vec![q(1, "ana", 2, 0, 0)], now, only_overdue()), want: vec![(7, 1), (8, 1)] },
            Case { name: "overdue: not before the threshold", state: st(2, two_pre(), vec![q(1, "ana", 2, 0, now - 30 * M)], now, only_overdue()), want: vec![] },
            Case { name: "overdue: a preempted job's wait counts from its preemption (it does not preempt back at once)", state: st(2, two_pre(), vec![QueuedJob { preempted_at_ms: Some(now - 5 * M), ..q(1, "ana", 2, 0, 0) }], now, only_overdue()), want: vec![] },
            Case { name: "never a non-preemptible job: one of the two holders is not, so nothing is preempted (never partially useless)", state: st(2, vec![pre(7, "bob", &[0], 0), fixed(8, "bob", &[1])], vec![q(1, "ana", 2, 0, 0)], now, only_overdue()), want: vec![] },
            Case { name: "off: rules off preempt nothing", state: st(2, two_pre(), vec![q(1, "ana", 2, 0, 0)], now, PreemptRules { overdue: false, priority_gap: None, fair_share: false, ..Default::default() }), want: vec![] },
            Case { name: "no [preemption] at all", state: { let mut s = st(2, two_pre(), vec![q(1, "ana", 2, 0, 0)], now, only_overdue()); s.config.preemption = None; s }, want: vec![] },
            // Guard rails.
            Case { name: "min_run: a job that started 5 minutes ago is not preempted", state: st(2, vec![pre(7, "bob", &[0], 0), pre(8, "bob", &[1], now - 5 * M)], vec![q(1, "ana", 2, 0, 0)], now, only_overdue()), want: vec![] },
            Case { name: "max_per_day: a job preempted 3 times today is not preempted again", state: st(2, vec![pre(7, "bob", &[0], 0), with(pre(8, "bob", &[1], 0), |v| v.preempted_today = 3)], vec![q(1, "ana", 2, 0, 0)], now, only_overdue()), want: vec![] },
            Case { name: "cheapest first: of three 1-GPU holders the one with the fewest GPU-minutes goes", state: st(3, vec![pre(7, "bob", &[0], 0), pre(8, "bob", &[1], now - 2 * H), pre(9, "bob", &[2], H)], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![(8, 1)] },
            Case { name: "cheapest first counts GPUs: a 2-GPU job 1 h in costs more than a 1-GPU job 1.5 h in", state: st(3, vec![pre(7, "bob", &[0, 1], now - H), pre(8, "bob", &[2], now - 90 * M)], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![(8, 1)] },
            Case { name: "cheapest first: among equals, the one that answered a checkpoint signal last", state: st(2, vec![with(pre(7, "bob", &[0], H), |v| v.checkpoint_ms = Some(2 * H)), with(pre(8, "bob", &[1], H), |v| v.checkpoint_ms = Some(5 * H))], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![(8, 1)] },
            Case { name: "never partially: a 1-GPU job that needs one GPU of a 2-GPU victim stops all of it (one decision)", state: st(2, vec![pre(7, "bob", &[0, 1], 0)], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![(7, 1)] },
            Case { name: "no loop: a job may not preempt the job that preempted it", state: st(2, vec![with(pre(7, "bob", &[0, 1], 0), |v| v.took_from = vec![1])], vec![q(1, "ana", 2, 0, 0)], now, only_overdue()), want: vec![] },
            Case { name: "no loop: nor one it was preempted for before", state: st(2, vec![with(pre(7, "bob", &[0, 1], 0), |v| v.preempted_for = vec![1])], vec![q(1, "ana", 2, 0, 0)], now, only_overdue()), want: vec![] },
            Case { name: "never for a lower-priority job", state: st(2, vec![with(pre(7, "bob", &[0, 1], 0), |v| v.priority = 1)], vec![q(1, "ana", 2, 0, 0)], now, only_overdue()), want: vec![] },
            Case { name: "a free GPU is used before anyone is preempted", state: st(2, vec![pre(7, "bob", &[0], 0)], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![] },
            Case { name: "a victim already stopping for the job is not decided again", state: st(2, vec![with(pre(7, "bob", &[0], 0), |v| v.stopping_for = Some(1)), pre(8, "bob", &[1], 0)], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![] },
            // The priority rule.
            Case { name: "priority: a job 10 above the victim preempts it at once (no wait needed)", state: st(1, vec![pre(7, "bob", &[0], 0)], vec![q(1, "ana", 1, 10, now)], now, only_priority(10)), want: vec![(7, 1)] },
            Case { name: "priority: 9 above is below the gap", state: st(1, vec![pre(7, "bob", &[0], 0)], vec![q(1, "ana", 1, 9, now)], now, only_priority(10)), want: vec![] },
            Case { name: "priority: never a non-preemptible job, whatever the gap", state: st(1, vec![fixed(7, "bob", &[0])], vec![q(1, "ana", 1, 100, now)], now, only_priority(10)), want: vec![] },
            Case { name: "priority: one victim serves one job; the second high job finds none", state: st(1, vec![pre(7, "bob", &[0], 0)], vec![q(1, "ana", 1, 10, now), q(2, "cho", 1, 10, now)], now, only_priority(10)), want: vec![(7, 1)] },
            Case { name: "priority: an interactive session (the engine's boost) preempts a preemptible batch job", state: st(1, vec![pre(7, "bob", &[0], 0)], vec![q(1, "ana", 1, SESSION_PRIORITY, now)], now, only_priority(10)), want: vec![(7, 1)] },
            // The fair-share rule.
            Case { name: "fair share: ana holds 0 of 2 (4 GPUs, 2 users), bob 4: bob's cheapest job goes", state: st(4, vec![pre(7, "bob", &[0], 0), pre(8, "bob", &[1], H), pre(9, "bob", &[2], 0), pre(10, "bob", &[3], 0)], vec![q(1, "ana", 1, 0, now)], now, only_fair()), want: vec![(8, 1)] },
            Case { name: "fair share: bob at his share (2 of 2) keeps his jobs", state: st(4, vec![fixed(5, "ana", &[0]), fixed(6, "ana", &[1]), pre(7, "bob", &[2], 0), pre(8, "bob", &[3], 0)], vec![q(1, "ana", 1, 0, now)], now, only_fair()), want: vec![] },
            Case { name: "fair share: not past the share — ana asking 3 of a share of 2", state: st(4, vec![pre(7, "bob", &[0], 0), pre(8, "bob", &[1], 0), pre(9, "bob", &[2], 0), pre(10, "bob", &[3], 0)], vec![q(1, "ana", 3, 0, now)], now, only_fair()), want: vec![] },
            Case { name: "fair share: a victim's owner is never pushed below the share (a 3-GPU job of bob's at 4 of 2)", state: st(4, vec![pre(7, "bob", &[0, 1, 2], 0), pre(8, "bob", &[3], 0)], vec![q(1, "ana", 2, 0, now)], now, only_fair()), want: vec![] },
        ];
        for c in cases {
            assert_eq!(decisions(&c.state), c.want, "{}", c.name);
        }
    }

    /// A preemptible job of `user`'s on `gpus` that declared `declared` ms and has run `past` ms
    /// beyond it at `now`.
    fn overrunning(id: i64, user: &str, gpus: &[u32], now: i64, declared: i64, past: i64) -> RunningJob {
        let started = now - declared - past;
        RunningJob {
            expected_end_ms: Some(started + declared),
            declared: Some(Declared {
                started_ms: started,
                runtime_ms: declared,
            }),
            ..pre(id, user, gpus, started)
        }
    }

    /// Issue 18 item 7: bob declared `expected_runtime: 1s` on a 53 s job to be backfilled; it ran
    /// past its promise and blocked the reserved 4-GPU job, and nothing cut it off.
    #[test]
    fn a_job_that_overran_its_declared_runtime_is_preempted_for_the_reservation_it_blocks() {
        const S: i64 = 1000;
        let now = 10 * H;
        let none = PreemptRules {
            overdue: false,
            priority_gap: None,
            fair_share: false,
            ..Default::default()
        };
        // alice's 4-GPU job (job 1) has waited 10 h: GPUs 0-3 are reserved for it. GPUs 0-2 are free;
        // bob's job 12 on GPU 3 declared 1 s and has run 53 s past it.
        let issue = |rules: PreemptRules| {
            st(
                4,
                vec![overrunning(12, "bob", &[3], now, S, 53 * S)],
                vec![q(1, "alice", 4, 0, 0)],
                now,
                rules,
            )
        };
        struct Case {
            name: &'static str,
            state: State,
            want: Vec<(i64, i64)>,
        }
        let cases = vec![
            Case { name: "the issue: 53 s past a 1 s declaration, preemptible: preempted (min_run does not protect a broken promise)", state: issue(only_overdue()), want: vec![(12, 1)] },
            Case { name: "the overrun rule holds with every other rule off", state: issue(none.clone()), want: vec![(12, 1)] },
            Case { name: "main's behaviour (a margin never reached): the overdue rule waits for min_run, 10 min", state: { let mut s = issue(only_overdue()); s.config.overrun_margin_ms = i64::MAX / 4; s }, want: vec![] },
            Case { name: "within the margin (20 s past, margin 30 s): not yet", state: st(4, vec![overrunning(12, "bob", &[3], now, S, 20 * S)], vec![q(1, "alice", 4, 0, 0)], now, none.clone()), want: vec![] },
            Case { name: "a long declaration's margin is a tenth of it: 10 h declared, 30 min past, is not an overrun", state: st(4, vec![overrunning(12, "bob", &[3], now, 10 * H, 30 * M)], vec![q(1, "alice", 4, 0, 0)], now, none.clone()), want: vec![] },
            Case { name: "...70 min past is", state: st(4, vec![overrunning(12, "bob", &[3], now, 10 * H, 70 * M)], vec![q(1, "alice", 4, 0, 0)], now, none.clone()), want: vec![(12, 1)] },
            Case { name: "not preemptible: never stopped (demoted instead)", state: st(4, vec![RunningJob { victim: None, ..overrunning(12, "bob", &[3], now, S, 53 * S) }], vec![q(1, "alice", 4, 0, 0)], now, none.clone()), want: vec![] },
            Case { name: "only for a reservation: a job that has not waited past reserve_after preempts no one", state: st(4, vec![overrunning(12, "bob", &[3], now, S, 53 * S)], vec![q(1, "alice", 4, 0, now - 5 * M)], now, none.clone()), want: vec![] },
            Case { name: "the other guard rails hold: max_per_day", state: st(4, vec![with(overrunning(12, "bob", &[3], now, S, 53 * S), |v| v.preempted_today = 3)], vec![q(1, "alice", 4, 0, 0)], now, none.clone()), want: vec![] },
            Case { name: "the other guard rails hold: never for a lower-priority job", state: st(4, vec![with(overrunning(12, "bob", &[3], now, S, 53 * S), |v| v.priority = 5)], vec![q(1, "alice", 4, 0, 0)], now, none.clone()), want: vec![] },
            Case { name: "an honest job beside it still runs: preempting the liar alone would not let the job start, so not yet", state: st(4, vec![overrunning(12, "bob", &[3], now, S, 53 * S), RunningJob { victim: None, expected_end_ms: Some(now + H), ..pre(13, "cho", &[2], 0) }], vec![q(1, "alice", 4, 0, 0)], now, none.clone()), want: vec![] },
        ];
        for c in cases {
            assert_eq!(decisions(&c.state), c.want, "{}", c.name);
        }
        // What the user sees: the victim's reason and the waiting job's.
        let p = plan(&issue(only_overdue()));
        assert_eq!(
            p.preempt[0].why.to_string(),
            "job 12 ran 53s past its declared 1s runtime, on GPUs reserved for alice's 4-GPU job"
        );
        assert_eq!(p.waiting[0].reason, "preempting job 12 for it (job 12 ran 53s past its declared 1s runtime, on GPUs reserved for alice's 4-GPU job); starts when it has stopped");
        assert_eq!(p.waiting[0].reserved, vec![0, 1, 2, 3]);
        // Not preemptible: it runs on, and the reserved job says whom it waits for and why.
        let s = st(
            4,
            vec![RunningJob {
                victim: None,
                ..overrunning(12, "bob", &[3], now, S, 53 * S)
            }],
            vec![q(1, "alice", 4, 0, 0), q(2, "cho", 1, 0, now)],
            now,
            none,
        );
        let p = plan(&s);
        assert_eq!(
            p.placements,
            vec![],
            "the reservation holds GPUs 0-2 for it; nothing backfills on a broken promise: {p:?}"
        );
        let w = &p.waiting.iter().find(|w| w.job_id == 1).unwrap().reason;
        assert!(w.ends_with("; waits for job 12, which ran 53s past its declared 1s runtime (not preemptible, so it runs to its end; no job is backfilled on its promise any more)"), "{w}");
    }

    #[test]
    fn the_waiting_job_says_why_and_keeps_the_gpus() {
        let s = st(
            2,
            vec![pre(7, "bob", &[0], 0), pre(8, "bob", &[1], 0)],
            vec![q(1, "alice", 2, 0, 0), q(2, "cho", 1, 0, 2 * H)],
            3 * H,
            only_overdue(),
        );
        let p = plan(&s);
        let w = p.waiting.iter().find(|w| w.job_id == 1).unwrap();
        assert_eq!(w.reserved, vec![0, 1]);
        assert!(
            w.reason
                .starts_with("preempting jobs 7, 8 for it (alice's 2-GPU job waited 3h"),
            "{}",
            w.reason
        );
        assert_eq!(
            p.preempt[0].why,
            PreemptWhy::Overdue {
                user: "alice".into(),
                gpus: 2,
                waited_ms: 3 * H
            }
        );
        // Next pass, while they stop: no new decision, the GPUs stay held, and then it starts.
        let stopping = |r: RunningJob| with(r, |v| v.stopping_for = Some(1));
        let s2 = State {
            running: vec![stopping(pre(7, "bob", &[0], 0)), stopping(pre(8, "bob", &[1], 0))],
            ..s.clone()
        };
        let p2 = plan(&s2);
        assert!(p2.preempt.is_empty(), "{p2:?}");
        let w = p2.waiting.iter().find(|w| w.job_id == 1).unwrap();
        assert_eq!(
            (w.reserved.clone(), w.reason.as_str()),
            (vec![0, 1], "starts when jobs 7, 8 have stopped (preempted for it)")
        );
        // Once they stopped, what was freed for it is its claim: a job ahead of it in the order
        // (priority 5) may not take it.
        let mut s3 = State { running: vec![], ..s };
        s3.config.reserve_after_ms = 100 * H; // no longer the starving job that goes first
        s3.queued.push(QueuedJob {
            priority: 5,
            ..q(3, "cho", 1, 0, 2 * H)
        });
        s3.config.claims = vec![(1, vec![0, 1])];
        assert_eq!(
            plan(&s3).placements,
            vec![Placement {
                job_id: 1,
                gpus: vec![0, 1]
            }]
        );
        s3.config.claims.clear();
        assert_eq!(
            plan(&s3).placements[0].job_id,
            3,
            "without the claim the job ahead takes a GPU"
        );
    }

    /// Found by the real-Docker test: a 2-GPU job preempting a 1-GPU job on a 2-GPU machine (the
    /// other GPU free) must keep the free GPU too, or the preempted job comes straight back on it and
    /// the 2-GPU job waits for its whole run.
    #[test]
    fn the_free_gpus_a_preempting_job_needs_are_kept_for_it_too() {
        let now = 10 * H;
        let s = st(
            2,
            vec![pre(7, "bob", &[0], 0)],
            vec![q(1, "ana", 2, 10, now)],
            now,
            only_priority(10),
        );
        let p = plan(&s);
        assert_eq!(
            p.preempt
                .iter()
                .map(|d| (d.job, d.for_job, d.gpus.clone()))
                .collect::<Vec<_>>(),
            [(7, 1, vec![0, 1])]
        );
        assert!(p.placements.is_empty(), "nothing takes the free GPU meanwhile: {p:?}");
        // Next pass: the victim stopped and is queued again, but GPU 0 still shows its process (until
        // the next sample), so job 1 cannot start yet. The claim the engine records from the
        // decision keeps GPU 1 for job 1 too: the victim does not come back on it.
        let mut s2 = st(
            2,
            vec![],
            vec![
                QueuedJob {
                    preempted_at_ms: Some(now),
                    ..q(7, "bob", 1, 0, 0)
                },
                q(1, "ana", 2, 10, now),
            ],
            now,
            only_priority(10),
        );
        s2.gpus[0].external_busy = true;
        s2.config.claims = vec![(1, p.preempt[0].gpus.clone())];
        assert_eq!(
            plan(&s2).placements,
            vec![],
            "the victim came back on a GPU kept for job 1"
        );
        // With only the victim's GPU claimed (the bug), it would have.
        s2.config.claims = vec![(1, vec![0])];
        assert_eq!(
            plan(&s2).placements,
            vec![Placement {
                job_id: 7,
                gpus: vec![1]
            }]
        );
        // Once GPU 0 reads free, job 1 starts on both.
        s2.gpus[0].external_busy = false;
        s2.config.claims = vec![(1, p.preempt[0].gpus.clone())];
        assert_eq!(
            plan(&s2).placements,
            vec![Placement {
                job_id: 1,
                gpus: vec![0, 1]
            }]
        );
    }

    #[test]
    fn no_preemption_loop_over_passes() {
        // A (priority 10) preempts B (0). Then B, requeued, may never preempt A: not by priority
        // (lower), not by the overdue rule (A took from it; B's wait restarted), not by fair share
        // (its owner would have to be below the share while A's above).
        let rules = PreemptRules {
            overdue: true,
            priority_gap: Some(10),
            fair_share: true,
            ..Default::default()
        };
        let now = 10 * H;
        let s = st(
            1,
            vec![pre(2, "bob", &[0], 0)],
            vec![q(1, "ana", 1, 10, now)],
            now,
            rules.clone(),
        );
        assert_eq!(decisions(&s), vec![(2, 1)]);
        let later = now + 5 * H;
        let a_runs = RunningJob {
            victim: Some(Victim {
                priority: 10,
                started_ms: now,
                took_from: vec![2],
                ..Default::default()
            }),
            ..pre(1, "ana", &[0], now)
        };
        let b_waits = QueuedJob {
            preempted_at_ms: Some(now),
            ..q(2, "bob", 1, 0, 0)
        };
        let s = st(1, vec![a_runs.clone()], vec![b_waits.clone()], later, rules.clone());
        assert_eq!(decisions(&s), vec![]);
        // Even at the same priority and long overdue, the job A took from cannot take it back.
        let s = st(
            1,
            vec![RunningJob {
                victim: Some(Victim {
                    priority: 0,
                    ..a_runs.victim.clone().unwrap()
                }),
                ..a_runs
            }],
            vec![b_waits],
            later + 100 * H,
            rules,
        );
        assert_eq!(decisions(&s), vec![]);
    }
}
