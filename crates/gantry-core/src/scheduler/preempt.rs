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
//! - **CPU-only work** (on whenever preemption is): a GPU job whose GPUs are free but whose CPU or RAM
//!   is held by preemptible CPU-only jobs of other users preempts them (issue 33: a GPU never idles
//!   for CPU-only work while someone's GPU job waits).
//!
//! Never emptier, never unfair (issue 32), for the waiting rules (overdue, fair share): the victims
//! hold no more GPU capacity than the waiting job will take (whole GPUs count 1 each, a shared job its
//! memory over the GPU's), so a swap never leaves GPUs idle; and the overdue rule stops only jobs
//! submitted after the waiting job (a wide job also its own user's older ones while no other user has
//! a GPU job waiting), since a preempted job goes back to its place in the queue, ahead of everyone
//! submitted after it. The priority rule is the lab's word and keeps its reach.
//!
//! Worth it (issue 32), for the overdue rule: the GPU time the waiting job gains (its capacity times
//! the wait it skips, to the victims' expected ends) exceeds the work the victims lose
//! ([`worth_it`]); no estimates, no check.
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
    /// When it was submitted: the waiting rules stop only jobs submitted after the job they stop them
    /// for (ties: the higher job id), so a preemption never puts an older job behind a younger one.
    #[serde(default)]
    pub submitted_ms: i64,
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
    /// When it last reported saving a checkpoint this attempt (a metrics point carrying the key
    /// `checkpoint` in its `GANTRY_METRICS` file), if it did: preempting it now loses only the work
    /// since then, so victims are chosen by that ([`lost_ms`]). `None`: none reported (the work since
    /// its start counts as lost). The simulator fills it from its checkpoint model.
    #[serde(default)]
    pub last_checkpoint_ms: Option<i64>,
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
    /// The waiting job's GPUs are free; the CPU or RAM it needs is held by CPU-only jobs.
    CpuOnly { user: String, gpus: u32 },
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
            PreemptWhy::CpuOnly { user, gpus } => write!(
                f,
                "{user}'s {} job: its GPUs are free, the CPU or RAM it needs is held by CPU-only jobs",
                shape(gpus)
            ),
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

/// The GPU capacity `gpus` hold for a job asking `gpu_memory` of each (whole GPUs: 1 each; a share:
/// its memory over the GPU's), as the simulator's allocated share counts it.
fn alloc(state: &State, gpus: &[u32], gpu_memory: Option<u64>) -> f64 {
    gpus.iter()
        .map(|g| match gpu_memory {
            None => 1.0,
            Some(m) => {
                let total = state.gpus.iter().find(|v| v.index == *g).map_or(0, |v| v.memory_total);
                if total == 0 {
                    1.0
                } else {
                    (m as f64 / total as f64).min(1.0)
                }
            }
        })
        .sum()
}

/// The waiting job's capacity if it started on `gpus` (or on `n` of the largest GPUs, before it is
/// known where).
fn waiter_alloc(state: &State, job: &QueuedJob, gpus: Option<&[u32]>) -> f64 {
    match gpus {
        Some(g) if !g.is_empty() => alloc(state, g, job.gpu_memory),
        _ => {
            let biggest = state
                .gpus
                .iter()
                .map(|v| v.index)
                .max_by_key(|i| state.gpus.iter().find(|v| v.index == *i).map_or(0, |v| v.memory_total));
            alloc(state, &biggest.into_iter().collect::<Vec<_>>(), job.gpu_memory) * job.gpus as f64
        }
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
        // Waiting rules (overdue, fair share) never leave the machine emptier (issue 32): a victim
        // holds no more GPU capacity than the waiting job will (a job sharing a GPU by memory does not
        // stop a whole-GPU job; a 1-GPU job does not stop a 2-GPU one), checked again for the set.
        let my_alloc = waiter_alloc(state, job, None);
        let no_emptier = |r: &&RunningJob| alloc(state, &r.gpus, r.gpu_memory) <= my_alloc + 1e-9;
        // Per-user fairness (issue 32): the overdue rule stops only jobs submitted after the waiting
        // one (a younger victim only undoes its start ahead of it). A preempted job goes back to its
        // place in the queue: an older one would go ahead of the users waiting behind it, who then wait
        // for it twice, and for a 1-GPU job it only reorders the queue and loses work. One exception: a
        // wide job may stop its own user's older jobs while no other user has a GPU job waiting (it cuts
        // that user's own drain; nobody else waits behind the victim).
        let others_wait = state
            .queued
            .iter()
            .any(|q| q.gpus > 0 && q.user != job.user && q.not_before_ms.is_none_or(|nb| nb <= now));
        let younger = |r: &&RunningJob| {
            (job.gpus >= 2 && r.user == job.user && !others_wait)
                || r.victim
                    .as_ref()
                    .is_some_and(|v| (v.submitted_ms, r.job_id) > (job.submitted_at_ms, job.job_id))
        };
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
        if choose(&trial, job, ctx, false).is_ok() && !cpu_fits(pool, job, &[]) {
            let vs: Vec<&RunningJob> = state
                .running
                .iter()
                .filter(eligible)
                .filter(|r| r.gpus.is_empty() && r.user != job.user)
                .collect();
            if !vs.is_empty() {
                tried.push((
                    vs,
                    PreemptWhy::CpuOnly {
                        user: job.user.clone(),
                        gpus: job.gpus,
                    },
                ));
            }
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
            let vs: Vec<&RunningJob> = state
                .running
                .iter()
                .filter(eligible)
                .filter(no_emptier)
                .filter(younger)
                .collect();
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
                .filter(no_emptier)
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
        // Why the overdue rule did not preempt when only its cost check held it back (said in the reason).
        let mut not_worth: Option<String> = None;
        for (mut vs, why) in tried {
            // Cheapest first: the fewest GPU-minutes lost, i.e. since its last reported checkpoint
            // (else its start; a CPU-only job's minutes count as one GPU's, as in fair share), then
            // the latest checkpoint signal answered.
            vs.sort_by_key(|r| {
                let v = r.victim.as_ref().expect("eligible victims are preemptible");
                (
                    lost_ms(v, now) as i128 * r.gpus.len().max(1) as i128,
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
            if matches!(why, PreemptWhy::Overdue { .. } | PreemptWhy::FairShare { .. })
                && take.iter().map(|r| alloc(state, &r.gpus, r.gpu_memory)).sum::<f64>()
                    > waiter_alloc(state, job, Some(&target)) + 1e-9
            {
                continue;
            }
            if matches!(why, PreemptWhy::Overdue { .. }) && !worth_it(state, job, &target, &take) {
                not_worth = Some(not_worth_it(&take, now));
                continue;
            }
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
            not_worth = None;
            break;
        }
        if let Some(note) = not_worth {
            if !out.waiting[w].reason.is_empty() {
                out.waiting[w].reason = format!("{}; {note}", out.waiting[w].reason);
            }
        }
    }
}

/// "not preempting job 8: it is expected to end in 2m, too soon to be worth the 12m of work it would lose".
fn not_worth_it(take: &[&RunningJob], now: i64) -> String {
    let names = take.iter().map(|r| r.job_id.to_string()).collect::<Vec<_>>().join(", ");
    let ends = take.iter().filter_map(|r| r.expected_end_ms).max().unwrap_or(now);
    let lost: i64 = take
        .iter()
        .filter_map(|r| r.victim.as_ref().map(|v| lost_ms(v, now)))
        .sum();
    let (jobs, they, is, end) = if take.len() == 1 {
        ("job", "it", "is", "in")
    } else {
        ("jobs", "they", "are", "within")
    };
    format!(
        "not preempting {jobs} {names}: {they} {is} expected to end {end} {}, too soon to be worth the {} of work {they} would lose",
        crate::units::duration_ms((ends - now).max(0)),
        crate::units::duration_ms(lost)
    )
}

/// The overdue rule's cost check (issue 32): stopping `take` so that `job` starts on `target` now
/// must save more GPU time than it throws away. Saved: the job's capacity times the wait it skips,
/// until the last victim was expected to end (`expected_end_ms`: declared or learned). Thrown away:
/// each victim's capacity times the work it loses ([`lost_ms`]). A 1-GPU job does not stop a job
/// expected to end in 2 minutes that would lose 12 minutes of work; an 8-GPU job still stops it when
/// its drain would otherwise last 10 hours. A victim without an estimate counts as ending never (no
/// check: preemption as before estimates).
fn worth_it(state: &State, job: &QueuedJob, target: &[u32], take: &[&RunningJob]) -> bool {
    let now = state.now_ms;
    let Some(ends) = take.iter().map(|r| r.expected_end_ms).collect::<Option<Vec<i64>>>() else {
        return true;
    };
    let skipped_ms = ends.iter().map(|e| (e - now).max(0)).max().unwrap_or(0) as f64;
    let lost: f64 = take
        .iter()
        .map(|r| alloc(state, &r.gpus, r.gpu_memory) * r.victim.as_ref().map_or(0, |v| lost_ms(v, now)) as f64)
        .sum();
    skipped_ms * waiter_alloc(state, job, Some(target)) > lost
}

/// The work a victim loses if stopped at `now`: since its last reported checkpoint this attempt, else
/// since its start.
pub fn lost_ms(v: &Victim, now: i64) -> i64 {
    let since = v.last_checkpoint_ms.map_or(v.started_ms, |c| c.max(v.started_ms));
    (now - since).max(0)
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
    let Some(free) = pool.free_for(job) else {
        return true;
    };
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
mod tests;
