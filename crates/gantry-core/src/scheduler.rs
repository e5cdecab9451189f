//! The scheduler: a pure, deterministic function from (queued jobs, GPU state, running jobs) to
//! placements. No I/O, no clock: `now` comes in with the state.
//!
//! Rules:
//! - Order by priority (high first), then submission time, then id.
//! - A job gets only GPUs that no Gantry job holds exclusively, that processes outside Gantry do not
//!   occupy, and that have enough free memory. Jobs without `gpu_memory` get whole, empty GPUs; jobs
//!   with it are packed best-fit onto GPUs shared with other declared-memory jobs.
//! - No head-of-line blocking: a job that cannot start does not stop later jobs that fit...
//! - ...but once a job has waited longer than `reserve_after_ms`, it reserves GPUs: later jobs may not
//!   take them, so it starts as soon as they drain (no starvation).
//! - Every job that does not start gets a human-readable reason.
//! - A job with a [`crate::spec::GpuFilter`] (`gpu_type`, `min_gpu_memory`) only gets GPUs it accepts.
//! - Among equally good choices of several GPUs, the best-connected set wins (NVLink, same board,
//!   same PCIe switch, ...) when NVML reports the topology.
//! - CPU and RAM are counted like GPUs when the state carries the machine's capacity (`host`): a job
//!   starts only when its `needs` fit beside the running jobs' (simulated traces carry none).

pub use crate::spec::GpuFilter;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    pub index: u32,
    pub memory_total: u64,
    /// Memory in use as measured (all processes).
    pub memory_used: u64,
    /// Processes outside Gantry use this GPU (someone's notebook): it is busy.
    pub external_busy: bool,
    /// Measured memory not used by this engine's jobs (a display server, processes NVML does not list):
    /// shared jobs pack into what is left after it AND the declared memory of the jobs there.
    #[serde(default)]
    pub outside_used: u64,
    /// The GPU's name (NVML's, e.g. "NVIDIA H100 80GB HBM3"), matched by `gpu_type`.
    #[serde(default)]
    pub name: String,
    /// Links to the other GPUs, when NVML reports a topology.
    #[serde(default)]
    pub links: Vec<crate::gpu::GpuLink>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunningJob {
    pub job_id: i64,
    /// The owner (per-user GPU cap).
    #[serde(default)]
    pub user: String,
    pub gpus: Vec<u32>,
    /// Declared memory per GPU; `None` = holds its GPUs exclusively.
    pub gpu_memory: Option<u64>,
    /// When it is expected to end (start + declared runtime), if known.
    #[serde(default)]
    pub expected_end_ms: Option<i64>,
    /// CPU and RAM it holds.
    #[serde(default)]
    pub needs: CpuRam,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueuedJob {
    pub job_id: i64,
    /// The owner (per-user GPU cap).
    #[serde(default)]
    pub user: String,
    pub priority: i32,
    pub submitted_at_ms: i64,
    pub gpus: u32,
    pub gpu_memory: Option<u64>,
    /// Not before this time (retry backoff).
    pub not_before_ms: Option<i64>,
    /// Declared (or learned) runtime, if known.
    #[serde(default)]
    pub expected_runtime_ms: Option<i64>,
    /// The owner's recent GPU usage (decayed GPU-hours); among equal priorities, lighter users go first.
    #[serde(default)]
    pub user_usage: f64,
    /// Which GPUs the job accepts.
    #[serde(default)]
    pub filter: GpuFilter,
    /// CPU and RAM it needs (its limits).
    #[serde(default)]
    pub needs: CpuRam,
}

/// CPU (thousandths) and RAM (bytes): a job's limits, or what the machine has for jobs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuRam {
    pub cpus_milli: u64,
    pub memory: u64,
}

pub use crate::units::format_cpus;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// After this long in the queue, a job that cannot start reserves GPUs.
    pub reserve_after_ms: i64,
    /// Use declared runtimes: jobs that end before a reservation's start may backfill its GPUs.
    #[serde(default = "yes")]
    pub use_runtimes: bool,
    /// See `State::typical_wait_ms`.
    #[serde(default = "factor_default")]
    pub reserve_factor: f64,
    /// Jobs asking for 2+ GPUs reserve once they waited this many times the typical wait (and at
    /// least `reserve_after_ms`). Their wait is a drain, not a queue position: see docs/scheduling.md.
    #[serde(default = "wide_factor_default")]
    pub wide_reserve_factor: f64,
    /// A 1-GPU job that waited past the threshold moves to the front of the queue (aging) instead
    /// of reserving. Off by default: on held-out loads it turns shortest-first into FIFO for every
    /// old job and costs mean wait (docs/scheduling.md).
    #[serde(default)]
    pub age_narrow: bool,
    /// Reserve only if the GPUs are expected to drain within this many times the typical wait or
    /// the job's own wait so far, whichever is longer: a reservation at most doubles what the job
    /// has waited, so the GPU time it idles is bounded by its own wait (default 1).
    #[serde(default = "drain_limit_default")]
    pub drain_limit_factor: Option<f64>,
    /// Wide jobs share a drain: see `starving`.
    #[serde(default = "yes")]
    pub share_drains: bool,
    /// With runtimes, order by response ratio (wait + work) / work instead of shortest work first.
    #[serde(default)]
    pub hrrn: bool,
    /// Pack shared jobs onto the GPU with the least (best fit) or most (worst fit) memory left.
    #[serde(default)]
    pub packing: Packing,
    /// Write a reason for at most this many waiting jobs (the rest say "waiting behind N jobs").
    /// Reasons cost string formatting; the simulator sets 0.
    #[serde(default = "explain_default")]
    pub explain_first: usize,
    /// The lab's limit on GPUs one user's running jobs hold together: a job that would pass it waits.
    #[serde(default)]
    pub max_running_gpus_per_user: Option<u32>,
    /// The recent mix of request shapes, for FGD packing (empty: best fit). Part of the pass's
    /// input rather than a setting: the engine and the simulator fill it from recent submissions.
    #[serde(default)]
    pub shapes: Vec<Shape>,
}

fn explain_default() -> usize {
    1000
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Packing {
    /// Fragmentation gradient descent (FGD, USENIX ATC'23) on one machine: the GPU where the
    /// expected fragmentation, weighted by the recent mix of request shapes (`State::shapes`),
    /// grows least; best fit among equals, and plain best fit when no mix is known.
    #[default]
    Fgd,
    BestFit,
    WorstFit,
}

/// A request shape and its share of recent requests (for [`Packing::Fgd`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shape {
    pub gpus: u32,
    /// Declared memory per GPU; `None` = whole GPUs.
    pub gpu_memory: Option<u64>,
    pub weight: f64,
}

/// The recent mix of request shapes: counts per shape, normalized to weights summing to 1.
pub fn shape_mix<'a>(shapes: impl IntoIterator<Item = (u32, Option<u64>)> + 'a) -> Vec<Shape> {
    let mut counts: std::collections::BTreeMap<(u32, Option<u64>), f64> = std::collections::BTreeMap::new();
    for s in shapes {
        if s.0 > 0 {
            *counts.entry(s).or_default() += 1.0;
        }
    }
    let total: f64 = counts.values().sum();
    counts.into_iter().map(|((gpus, gpu_memory), c)| Shape { gpus, gpu_memory, weight: c / total }).collect()
}

fn factor_default() -> f64 {
    3.0
}

fn drain_limit_default() -> Option<f64> {
    Some(1.0)
}

fn wide_factor_default() -> f64 {
    3.0
}

fn yes() -> bool {
    true
}

impl Default for Config {
    fn default() -> Self {
        Config {
            reserve_after_ms: 30 * 60 * 1000,
            reserve_factor: factor_default(),
            wide_reserve_factor: wide_factor_default(),
            age_narrow: false,
            drain_limit_factor: Some(1.0),
            share_drains: true,
            hrrn: false,
            use_runtimes: true,
            packing: Packing::default(),
            explain_first: explain_default(),
            max_running_gpus_per_user: None,
            shapes: vec![],
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub now_ms: i64,
    pub gpus: Vec<GpuView>,
    pub running: Vec<RunningJob>,
    pub queued: Vec<QueuedJob>,
    pub config: Config,
    /// Mean wait of recently started jobs. A job reserves GPUs only once it has waited
    /// `reserve_factor` times this (and at least `reserve_after_ms`): reservations are for jobs that
    /// fall behind their peers, because draining GPUs for them costs capacity.
    #[serde(default)]
    pub typical_wait_ms: Option<i64>,
    /// CPU and RAM the machine has for jobs (`None`: not counted).
    #[serde(default)]
    pub host: Option<CpuRam>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub job_id: i64,
    pub gpus: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiting {
    pub job_id: i64,
    /// 1-based position among waiting jobs, in scheduling order.
    pub position: usize,
    /// Why it waits; empty past `explain_first` (see [`Waiting::why`]), so a deep queue costs no
    /// string per job.
    pub reason: String,
    /// This job holds a reservation on these GPUs.
    pub reserved: Vec<u32>,
}

impl Waiting {
    /// The reason, or "waiting behind N other jobs" where the plan wrote none.
    pub fn why(&self) -> String {
        if self.reason.is_empty() {
            format!("waiting behind {} other jobs", self.position.saturating_sub(1))
        } else {
            self.reason.clone()
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub placements: Vec<Placement>,
    pub waiting: Vec<Waiting>,
}

#[derive(Debug, Clone)]
struct Slot {
    index: u32,
    name: String,
    total: u64,
    measured_used: u64,
    outside_used: u64,
    external: bool,
    exclusive_by: Option<i64>,
    shared_declared: u64,
    shared_jobs: Vec<i64>,
    /// Expected end of each Gantry job on this GPU (`None`: unknown).
    ends: Vec<Option<i64>>,
    /// Reserved for (job, the time that job is expected to start, if known).
    reserved_by: Option<(i64, Option<i64>)>,
}

impl Slot {
    fn free_for_shared(&self) -> u64 {
        self.total.saturating_sub((self.shared_declared + self.outside_used).max(self.measured_used))
    }
    fn is_empty(&self) -> bool {
        self.exclusive_by.is_none() && self.shared_jobs.is_empty()
    }
    /// When this GPU is expected to be free of Gantry jobs (`None`: unknown).
    fn free_at(&self, now: i64) -> Option<i64> {
        self.ends.iter().try_fold(now, |acc, e| e.map(|e| acc.max(e)))
    }
}

/// Scheduling order. Priority first (high first); then the owner's recent usage (light users
/// first). Then, when runtimes are known: "critical" jobs — those so long that starting them later
/// would stretch the whole schedule (runtime >= CRITICAL_FRACTION x the backlog per GPU) — first, then smallest work
/// (runtime x GPUs) first, which minimizes mean wait. Without runtimes: submission time. Ties: id.
pub fn order(state: &State) -> Vec<i64> {
    sorted(state).iter().map(|j| j.job_id).collect()
}

fn sorted(state: &State) -> Vec<&QueuedJob> {
    let runtimes = state.config.use_runtimes && state.queued.iter().any(|q| q.expected_runtime_ms.is_some());
    let critical_from = if runtimes { backlog_per_gpu(state) as f64 * CRITICAL_FRACTION } else { f64::INFINITY };
    let key = |q: &QueuedJob| -> (bool, i128) {
        match q.expected_runtime_ms {
            Some(rt) if runtimes && state.config.hrrn => {
                // Highest response ratio next: (wait + work) / work, largest first.
                let work = (rt.max(1) as f64) * q.gpus.max(1) as f64;
                let wait = (state.now_ms - q.submitted_at_ms).max(0) as f64;
                ((rt as f64) < critical_from, -(((wait + work) / work).min(1e15) * 1e3) as i128)
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
            .then(if aged(a) && aged(b) { a.submitted_at_ms.cmp(&b.submitted_at_ms) } else { std::cmp::Ordering::Equal })
            .then(a.user_usage.total_cmp(&b.user_usage))
            .then(key(a).cmp(&key(b)))
            .then(a.submitted_at_ms.cmp(&b.submitted_at_ms))
            .then(a.job_id.cmp(&b.job_id))
    });
    order
}

/// A job whose runtime is at least this fraction of the backlog per GPU is "critical": starting it
/// later would stretch the schedule's end. Tuned on the Alibaba trace (see docs/scheduling.md).
const CRITICAL_FRACTION: f64 = 0.25;

/// Known remaining work (GPU-ms) divided by the GPU count: how long the machine is busy if packed.
fn backlog_per_gpu(state: &State) -> i64 {
    let queued: i128 = state.queued.iter().filter_map(|q| q.expected_runtime_ms.map(|r| r as i128 * q.gpus as i128)).sum();
    let running: i128 = state
        .running
        .iter()
        .filter_map(|r| r.expected_end_ms.map(|e| (e - state.now_ms).max(0) as i128 * r.gpus.len() as i128))
        .sum();
    ((queued + running) / state.gpus.len().max(1) as i128) as i64
}

fn threshold(state: &State, factor: f64) -> i64 {
    let typical = state.typical_wait_ms.map(|t| (t as f64 * factor) as i64).unwrap_or(0);
    state.config.reserve_after_ms.max(typical)
}

/// Has `q` waited long enough to reserve GPUs (2+ GPUs) or, with `age_narrow`, to go first (1 GPU)?
fn overdue(state: &State, q: &QueuedJob) -> bool {
    let factor = if q.gpus >= 2 { state.config.wide_reserve_factor } else { state.config.reserve_factor };
    q.gpus > 0 && state.now_ms - q.submitted_at_ms >= threshold(state, factor)
}

/// The job that has waited longest past `reserve_after_ms` (it gets the one reservation), among
/// those its owner's GPU cap lets start.
fn starving<'a>(state: &'a State, caps: &UserCaps) -> Option<&'a QueuedJob> {
    // A drain is paid for once: while a job holding 2+ GPUs runs, the next wide job that its GPUs
    // can serve queues for them as they free (so a burst of wide jobs shares one drain).
    let widest_running = if state.config.share_drains { state.running.iter().map(|r| r.gpus.len() as u32).max().unwrap_or(0) } else { 0 };
    state
        .queued
        .iter()
        .filter(|q| (overdue(state, q) || (q.gpus >= 2 && q.gpus <= widest_running)) && (q.gpus >= 2 || !state.config.age_narrow))
        .filter(|q| caps.over(q).is_none())
        .filter(|q| q.not_before_ms.is_none_or(|nb| nb <= state.now_ms))
        .min_by_key(|q| (q.submitted_at_ms, q.job_id))
}

/// GPUs each user's jobs hold, against the lab's per-user cap.
struct UserCaps<'a> {
    cap: Option<u32>,
    held: std::collections::HashMap<&'a str, u32>,
}

impl<'a> UserCaps<'a> {
    fn new(state: &'a State) -> Self {
        let cap = state.config.max_running_gpus_per_user;
        let mut held = std::collections::HashMap::new();
        if cap.is_some() {
            for r in &state.running {
                *held.entry(r.user.as_str()).or_default() += r.gpus.len() as u32;
            }
        }
        UserCaps { cap, held }
    }
    /// Why `job` may not start now because of its owner's cap.
    fn over(&self, job: &QueuedJob) -> Option<String> {
        let cap = self.cap.filter(|_| job.gpus > 0)?;
        let held = self.held.get(job.user.as_str()).copied().unwrap_or(0);
        if held + job.gpus <= cap {
            return None;
        }
        let plural = |n: u32| if n == 1 { "" } else { "s" };
        Some(if held == 0 {
            format!("asks for {} GPUs; the lab limit is {cap} GPU{} per user", job.gpus, plural(cap))
        } else {
            format!("{} already runs {held} GPU{}; the lab limit is {cap} per user", job.user, plural(held))
        })
    }
    fn took(&mut self, job: &'a QueuedJob) {
        if self.cap.is_some() {
            *self.held.entry(job.user.as_str()).or_default() += job.gpus;
        }
    }
}

/// Which amount of a [`CpuRam`], its unit's words, and how to show it.
type Measure = (fn(&CpuRam) -> u64, &'static str, fn(u64) -> String);

/// CPU and RAM left for jobs, and which jobs hold the rest (for the reason a job waits).
struct Pool<'a> {
    /// `None`: not counted.
    free: Option<CpuRam>,
    cap: CpuRam,
    holders: Vec<(&'a str, i64, CpuRam)>,
}

impl<'a> Pool<'a> {
    fn new(state: &'a State) -> Self {
        let holders: Vec<(&str, i64, CpuRam)> = state.running.iter().map(|r| (r.user.as_str(), r.job_id, r.needs)).collect();
        let cap = state.host.unwrap_or_default();
        let free = state.host.map(|c| CpuRam {
            cpus_milli: c.cpus_milli.saturating_sub(holders.iter().map(|h| h.2.cpus_milli).sum()),
            memory: c.memory.saturating_sub(holders.iter().map(|h| h.2.memory).sum()),
        });
        Pool { free, cap, holders }
    }

    /// Why `job`'s CPU or RAM does not fit now (empty when not `explain`ed).
    fn lacks(&self, job: &QueuedJob, explain: bool) -> Option<String> {
        let free = self.free?;
        let n = job.needs;
        let cpu = n.cpus_milli > free.cpus_milli;
        if !cpu && n.memory <= free.memory {
            return None;
        }
        if !explain {
            return Some(String::new());
        }
        let (pick, what, fmt): Measure = if cpu {
            (|c| c.cpus_milli, if n.cpus_milli == 1000 { "CPU" } else { "CPUs" }, format_cpus)
        } else {
            (|c| c.memory, "of memory", crate::units::format_bytes)
        };
        if pick(&n) > pick(&self.cap) {
            return Some(format!("needs {} {what}, this machine has {} for jobs", fmt(pick(&n)), fmt(pick(&self.cap))));
        }
        let mut by: Vec<&(&str, i64, CpuRam)> = self.holders.iter().filter(|h| pick(&h.2) > 0).collect();
        by.sort_by_key(|h| (std::cmp::Reverse(pick(&h.2)), h.1));
        let mut who: Vec<String> = by.iter().take(3).map(|(u, id, c)| format!("{u}'s job {id} uses {}", fmt(pick(c)))).collect();
        if by.len() > 3 {
            who.push(format!("{} more jobs", by.len() - 3));
        }
        Some(format!("needs {} {what}, {} free ({})", fmt(pick(&n)), fmt(pick(&free)), who.join("; ")))
    }

    fn took(&mut self, job: &'a QueuedJob) {
        if let Some(f) = &mut self.free {
            f.cpus_milli = f.cpus_milli.saturating_sub(job.needs.cpus_milli);
            f.memory = f.memory.saturating_sub(job.needs.memory);
            self.holders.push((job.user.as_str(), job.job_id, job.needs));
        }
    }
}

/// Compute placements. Deterministic: same state in, same plan out.
pub fn plan(state: &State) -> Plan {
    let mut slots: Vec<Slot> = state
        .gpus
        .iter()
        .map(|g| Slot {
            index: g.index,
            name: g.name.clone(),
            total: g.memory_total,
            measured_used: g.memory_used,
            outside_used: g.outside_used,
            external: g.external_busy,
            exclusive_by: None,
            shared_declared: 0,
            shared_jobs: vec![],
            ends: vec![],
            reserved_by: None,
        })
        .collect();
    slots.sort_by_key(|s| s.index);
    for r in &state.running {
        for g in &r.gpus {
            if let Some(s) = slots.iter_mut().find(|s| s.index == *g) {
                match r.gpu_memory {
                    None => s.exclusive_by = Some(r.job_id),
                    Some(m) => {
                        s.shared_declared += m;
                        s.shared_jobs.push(r.job_id);
                    }
                }
                s.ends.push(r.expected_end_ms);
            }
        }
    }
    let ctx = Ctx { now: state.now_ms, use_runtimes: state.config.use_runtimes, packing: state.config.packing, topology: Topology::of(&state.gpus), shapes: &state.config.shapes };
    let explain = |out: &Plan| out.waiting.len() < state.config.explain_first;
    let mut out = Plan::default();
    // The one starving job goes first: it starts now, or reserves the GPUs that free up first and
    // nothing else may take them unless it is known to end before the reserved job can start.
    let mut caps = UserCaps::new(state);
    let mut pool = Pool::new(state);
    let starving = starving(state, &caps);
    let mut reserved_for: Option<(i64, Vec<u32>, String)> = None;
    if let Some(job) = starving {
        match choose(&slots, job, &ctx, true) {
            // Its GPUs are free but its CPU or RAM is not: waiting for CPU leaves the GPUs to others.
            Ok(_) if pool.lacks(job, false).is_some() => reserved_for = Some((job.job_id, vec![], pool.lacks(job, true).unwrap_or_default())),
            Ok(chosen) => {
                take(&mut slots, job, &chosen, &ctx);
                caps.took(job);
                pool.took(job);
                out.placements.push(Placement { job_id: job.job_id, gpus: chosen });
            }
            Err(reason) => {
                let mut trial = slots.clone();
                let reserved = reserve(&mut trial, job, &ctx);
                let shadow = trial.iter().find_map(|s| s.reserved_by.filter(|r| r.0 == job.job_id).and_then(|r| r.1));
                let waited = state.now_ms - job.submitted_at_ms;
                let limit = state.config.drain_limit_factor.map(|f| (state.typical_wait_ms.unwrap_or(0).max(waited) as f64 * f) as i64);
                match (limit, shadow) {
                    (Some(limit), Some(sh)) if sh - state.now_ms > limit => {
                        // Draining would idle GPUs for longer than it is worth: wait without a reservation.
                        let reason = format!("{reason}; not reserving GPUs yet: they are expected to drain in {}", crate::units::duration_ms(sh - state.now_ms));
                        reserved_for = Some((job.job_id, vec![], reason));
                    }
                    _ => {
                        slots = trial;
                        reserved_for = Some((job.job_id, reserved, reason));
                    }
                }
            }
        }
    }
    for job in sorted(state) {
        if starving.is_some_and(|s| s.job_id == job.job_id) {
            if let Some((_, reserved, reason)) = reserved_for.take() {
                let waited = state.now_ms - job.submitted_at_ms;
                let reason = if reserved.is_empty() {
                    reason
                } else {
                    format!("{reason}; waited {}, so GPUs {} are reserved for it", crate::units::duration_ms(waited), list(&reserved))
                };
                push_wait(&mut out, job.job_id, reason, reserved);
            }
            continue;
        }
        if let Some(nb) = job.not_before_ms {
            if nb > state.now_ms {
                let secs = (nb - state.now_ms + 999) / 1000;
                let reason = if explain(&out) { format!("retrying after a failure in {secs}s") } else { String::new() };
                push_wait(&mut out, job.job_id, reason, vec![]);
                continue;
            }
        }
        let explained = explain(&out);
        // Past `explain_first`: no reason string (`Waiting::why` says "waiting behind N other jobs").
        let behind = |_: &Plan, reason: String| if explained { reason } else { String::new() };
        if job.gpus == 0 {
            match pool.lacks(job, explained) {
                Some(reason) => {
                    let reason = behind(&out, reason);
                    push_wait(&mut out, job.job_id, reason, vec![]);
                }
                None => {
                    pool.took(job);
                    out.placements.push(Placement { job_id: job.job_id, gpus: vec![] });
                }
            }
            continue;
        }
        if let Some(reason) = caps.over(job) {
            push_wait(&mut out, job.job_id, reason, vec![]);
            continue;
        }
        match choose(&slots, job, &ctx, explained) {
            Ok(_) if pool.lacks(job, false).is_some() => {
                let reason = behind(&out, pool.lacks(job, explained).unwrap_or_default());
                push_wait(&mut out, job.job_id, reason, vec![]);
            }
            Ok(chosen) => {
                take(&mut slots, job, &chosen, &ctx);
                caps.took(job);
                pool.took(job);
                out.placements.push(Placement { job_id: job.job_id, gpus: chosen });
            }
            Err(reason) => {
                let reason = behind(&out, reason);
                push_wait(&mut out, job.job_id, reason, vec![]);
            }
        }
    }
    out
}

struct Ctx<'a> {
    now: i64,
    use_runtimes: bool,
    packing: Packing,
    topology: Topology,
    shapes: &'a [Shape],
}

/// Free memory on each GPU for fragmentation purposes (0 where a job holds it whole or an outside
/// process uses it), and whether it can take a whole-GPU job.
fn frag_view(slots: &[Slot]) -> Vec<(u64, bool, u64)> {
    slots
        .iter()
        .map(|s| if s.external || s.exclusive_by.is_some() { (0, false, s.total) } else { (s.free_for_shared(), s.is_empty(), s.total) })
        .collect()
}

/// FGD's fragmentation of a machine for one request shape: the free GPU memory that cannot serve it.
/// If the machine can host the shape, that is the free memory of GPUs too full for it; if it cannot,
/// all its free memory. `gpus` = (free memory, takes a whole-GPU job, total).
pub fn fragmentation(gpus: &[(u64, bool, u64)], shape: &Shape) -> u64 {
    let serves = |g: &(u64, bool, u64)| match shape.gpu_memory {
        None => g.1,
        Some(m) => g.0 >= m,
    };
    let free: u64 = gpus.iter().map(|g| g.0).sum();
    if gpus.iter().filter(|g| serves(g)).count() >= shape.gpus as usize {
        gpus.iter().filter(|g| !serves(g)).map(|g| g.0).sum()
    } else {
        free
    }
}

/// Expected fragmentation: weighted by each shape's share of recent requests.
pub fn expected_fragmentation(gpus: &[(u64, bool, u64)], shapes: &[Shape]) -> f64 {
    shapes.iter().map(|s| s.weight * fragmentation(gpus, s) as f64).sum()
}

fn push_wait(out: &mut Plan, job_id: i64, reason: String, reserved: Vec<u32>) {
    let position = out.waiting.len() + 1;
    out.waiting.push(Waiting { job_id, position, reason, reserved });
}

fn list(g: &[u32]) -> String {
    g.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}


/// May `job` use a GPU reserved for another job? Only if it is known to end before that job starts.
fn may_backfill(job: &QueuedJob, shadow: Option<i64>, ctx: &Ctx) -> bool {
    ctx.use_runtimes && matches!((job.expected_runtime_ms, shadow), (Some(rt), Some(sh)) if ctx.now + rt <= sh)
}

/// Pick GPUs for `job`, or say why not.
fn choose(slots: &[Slot], job: &QueuedJob, ctx: &Ctx, explain: bool) -> Result<Vec<u32>, String> {
    let n = job.gpus as usize;
    let all = slots.len();
    let every = slots;
    let fgd = (ctx.packing == Packing::Fgd && !ctx.shapes.is_empty() && job.gpu_memory.is_some()).then(|| {
        let view = frag_view(every);
        (expected_fragmentation(&view, ctx.shapes), view)
    });
    let slots: Vec<&Slot> = slots.iter().filter(|s| job.filter.eligible(&s.name, s.total)).collect();
    if job.filter.is_any() && n > all {
        return Err(format!("needs {n} GPUs, this machine has {all}"));
    }
    if n > slots.len() {
        return Err(format!("waits for {}: this machine has {} such GPU{}", job.filter.describe(job.gpus), slots.len(), if slots.len() == 1 { "" } else { "s" }));
    }
    let mut reasons: Vec<String> = vec![];
    let mut reasons_push = |r: &dyn Fn() -> String| {
        if explain {
            reasons.push(r());
        }
    };
    let mut candidates: Vec<(u64, u32)> = vec![]; // (sort key, index)
    for s in slots.iter() {
        if let Some((r, shadow)) = s.reserved_by {
            if r != job.job_id && !may_backfill(job, shadow, ctx) {
                reasons_push(&|| format!("GPU {} reserved for job {r}", s.index));
                continue;
            }
        }
        if s.external {
            reasons_push(&|| format!("GPU {} in use outside this engine (another engine's job, or a process outside Gantry)", s.index));
            continue;
        }
        if let Some(j) = s.exclusive_by {
            reasons_push(&|| format!("GPU {} held by job {j}", s.index));
            continue;
        }
        match job.gpu_memory {
            None => {
                if s.is_empty() {
                    candidates.push((0, s.index));
                } else {
                    reasons_push(&|| format!("GPU {} shared by job {}", s.index, list_i64(&s.shared_jobs)));
                }
            }
            Some(m) => {
                let free = s.free_for_shared();
                if free >= m {
                    // Best fit: least free memory left first, keeping whole GPUs free for big jobs.
                    let left = free - m;
                    let key = match (&fgd, ctx.packing) {
                        (Some((before, view)), _) => {
                            // The growth of expected fragmentation if it goes here (in millionths of a
                            // GPU), then best fit among equals.
                            let mut after = view.clone();
                            if let Some(i) = every.iter().position(|x| x.index == s.index) {
                                after[i].0 = after[i].0.saturating_sub(m);
                                after[i].1 = false;
                            }
                            let grow = (expected_fragmentation(&after, ctx.shapes) - before) / s.total.max(1) as f64;
                            let grow = ((grow * 1e6).round() as i64 + (1 << 30)).clamp(0, (1 << 40) - 1) as u64;
                            (grow << 24) | (left >> 20).min((1 << 24) - 1)
                        }
                        (None, Packing::WorstFit) => u64::MAX - left,
                        (None, _) => left,
                    };
                    candidates.push((key, s.index));
                } else {
                    reasons_push(&|| format!(
                        "GPU {} has {} free{}, needs {}",
                        s.index,
                        crate::units::format_bytes(free),
                        if s.outside_used > 0 { format!(" ({} used outside Gantry)", crate::units::format_bytes(s.outside_used)) } else { String::new() },
                        crate::units::format_bytes(m)
                    ));
                }
            }
        }
    }
    if candidates.len() >= n {
        Ok(pick(candidates, n, &ctx.topology))
    } else if !explain {
        Err(String::new())
    } else {
        let what = match job.gpu_memory {
            None => format!("needs {n} free GPU{}", if n == 1 { "" } else { "s" }),
            Some(m) => format!("needs {n} GPU{} with {} free", if n == 1 { "" } else { "s" }, crate::units::format_bytes(m)),
        };
        let which = if job.filter.is_any() {
            String::new()
        } else {
            let matching: Vec<u32> = slots.iter().map(|s| s.index).collect();
            format!("waits for {}: GPU{} {} match{}; ", job.filter.describe(job.gpus), if matching.len() == 1 { "" } else { "s" }, list(&matching), if matching.len() == 1 { "es" } else { "" })
        };
        Err(format!("{which}{what}, {} available ({})", candidates.len(), summarize(&reasons)))
    }
}

/// "GPU 0 held by job 1; GPU 1 held by job 1" -> "GPUs 0,1 held by job 1".
fn summarize(reasons: &[String]) -> String {
    let mut groups: Vec<(String, Vec<String>)> = vec![];
    for r in reasons {
        let (gpu, rest) = r.strip_prefix("GPU ").and_then(|x| x.split_once(' ')).unwrap_or(("", r));
        match groups.iter_mut().find(|(k, _)| k == rest) {
            Some((_, g)) => g.push(gpu.to_string()),
            None => groups.push((rest.to_string(), vec![gpu.to_string()])),
        }
    }
    groups
        .into_iter()
        .map(|(rest, g)| if g.len() == 1 { format!("GPU {} {rest}", g[0]) } else { format!("GPUs {} {rest}", g.join(",")) })
        .collect::<Vec<_>>()
        .join("; ")
}

fn list_i64(v: &[i64]) -> String {
    v.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

fn take(slots: &mut [Slot], job: &QueuedJob, chosen: &[u32], ctx: &Ctx) {
    for s in slots.iter_mut().filter(|s| chosen.contains(&s.index)) {
        match job.gpu_memory {
            None => s.exclusive_by = Some(job.job_id),
            Some(m) => {
                s.shared_declared += m;
                s.shared_jobs.push(job.job_id);
            }
        }
        s.ends.push(job.expected_runtime_ms.map(|r| ctx.now + r));
    }
}

/// Reserve GPUs for a starving job: those expected to free up first (with runtimes), else those with
/// the fewest Gantry jobs. Returns the reserved indexes (empty if too few unreserved GPUs remain).
fn reserve(slots: &mut [Slot], job: &QueuedJob, ctx: &Ctx) -> Vec<u32> {
    let mut cands: Vec<(i64, usize, u32)> = slots
        .iter()
        .filter(|s| s.reserved_by.is_none() && !s.external && job.filter.eligible(&s.name, s.total))
        .map(|s| {
            let free_at = if ctx.use_runtimes { s.free_at(ctx.now).unwrap_or(i64::MAX) } else { 0 };
            (free_at, s.shared_jobs.len() + usize::from(s.exclusive_by.is_some()), s.index)
        })
        .collect();
    if cands.len() < job.gpus as usize {
        return vec![];
    }
    cands.sort();
    let chosen: Vec<(i64, usize, u32)> = cands.into_iter().take(job.gpus as usize).collect();
    // The job can start when the last of its GPUs frees up.
    let shadow = chosen.iter().map(|c| c.0).max().filter(|t| *t != i64::MAX);
    let mut idx: Vec<u32> = chosen.iter().map(|c| c.2).collect();
    for s in slots.iter_mut().filter(|s| idx.contains(&s.index)) {
        s.reserved_by = Some((job.job_id, shadow));
    }
    idx.sort();
    idx
}

// ---- Choosing GPUs: which GPUs a job accepts, and how well a set of GPUs is connected ----


/// Links between GPUs (by index) as NVML reports them; empty when it reports none (simulated GPUs).
#[derive(Debug, Clone, Default)]
struct Topology(std::collections::HashMap<(u32, u32), crate::gpu::Link>);

impl Topology {
    fn of(gpus: &[GpuView]) -> Self {
        Topology(gpus.iter().flat_map(|g| g.links.iter().map(move |l| ((g.index.min(l.peer), g.index.max(l.peer)), l.link))).collect())
    }
    /// Lower is closer; pairs NVML says nothing about rank below every known link.
    fn rank(&self, a: u32, b: u32) -> u8 {
        self.0.get(&(a.min(b), a.max(b))).map(|l| *l as u8).unwrap_or(u8::MAX)
    }
}

/// Choose `n` of the candidates (sort key, index; lower keys are better). The GPUs whose keys are
/// below the n-th best are in every best placement; the rest come from those tied with it, and when
/// the topology is known, they are the ones best connected: the set whose worst link is closest, then
/// the one with the most close links. Greedy from each possible start, which is exact for 2 GPUs and
/// for the usual NVLink pairs and quads.
fn pick(mut cands: Vec<(u64, u32)>, n: usize, topo: &Topology) -> Vec<u32> {
    cands.sort();
    let plain = |c: &[(u64, u32)]| {
        let mut v: Vec<u32> = c.iter().take(n).map(|c| c.1).collect();
        v.sort();
        v
    };
    if n < 2 || topo.0.is_empty() {
        return plain(&cands);
    }
    let bar = cands[n - 1].0;
    let must: Vec<u32> = cands.iter().filter(|c| c.0 < bar).map(|c| c.1).collect();
    let ties: Vec<u32> = cands.iter().filter(|c| c.0 == bar).map(|c| c.1).collect();
    if ties.len() == n - must.len() {
        return plain(&cands);
    }
    let seeds: Vec<Vec<u32>> = if must.is_empty() { ties.iter().map(|t| vec![*t]).collect() } else { vec![must] };
    let mut best: Option<((u8, u32), Vec<u32>)> = None;
    for mut set in seeds {
        // Per tied GPU not yet taken: (its worst link to the set, the sum of its links to the set).
        let mut pool: Vec<(u8, u32, u32)> = ties
            .iter()
            .filter(|t| !set.contains(t))
            .map(|t| set.iter().fold((0u8, 0u32, *t), |(w, sum, t), s| (w.max(topo.rank(t, *s)), sum + topo.rank(t, *s) as u32, t)))
            .collect();
        let mut score = set.iter().enumerate().flat_map(|(i, a)| set[i + 1..].iter().map(move |b| (*a, *b))).fold((0u8, 0u32), |(w, sum), (a, b)| {
            (w.max(topo.rank(a, b)), sum + topo.rank(a, b) as u32)
        });
        while set.len() < n {
            let (k, &(w, sum, t)) = pool.iter().enumerate().min_by_key(|(_, p)| **p).expect("enough tied GPUs");
            pool.swap_remove(k);
            score = (score.0.max(w), score.1 + sum);
            for p in pool.iter_mut() {
                let r = topo.rank(p.2, t);
                *p = (p.0.max(r), p.1 + r as u32, p.2);
            }
            set.push(t);
        }
        set.sort();
        if best.as_ref().is_none_or(|(s, b)| (score, &set) < (*s, b)) {
            best = Some((score, set));
        }
    }
    best.map(|b| b.1).unwrap_or_default()
}

/// What the job detail says about a multi-GPU placement when the topology is known:
/// "GPUs 0,1: NVLink", or the worst link of a larger set ("GPUs 0,1,2,3: same PCIe switch or closer").
pub fn topology_note(gpus: &[GpuView], chosen: &[u32]) -> Option<String> {
    let topo = Topology::of(gpus);
    let links: Vec<Option<crate::gpu::Link>> =
        chosen.iter().enumerate().flat_map(|(i, a)| chosen[i + 1..].iter().map(move |b| (*a, *b))).map(|(a, b)| topo.0.get(&(a.min(b), a.max(b))).copied()).collect();
    if links.is_empty() || links.iter().any(|l| l.is_none()) {
        return None;
    }
    let worst = links.iter().flatten().max()?;
    let all_same = links.iter().all(|l| l.as_ref() == Some(worst));
    Some(format!("GPUs {}: {}{}", list(chosen), worst.describe(), if all_same { "" } else { " or closer" }))
}

#[cfg(test)]
mod tests {
    use super::*;
    const G: u64 = 1 << 30;

    fn gpus(n: u32, mem: u64) -> Vec<GpuView> {
        (0..n).map(|i| GpuView { index: i, memory_total: mem, ..Default::default() }).collect()
    }
    fn q(id: i64, gpus: u32, mem: Option<u64>) -> QueuedJob {
        QueuedJob { job_id: id, user: "ada".into(), priority: 0, submitted_at_ms: id, gpus, gpu_memory: mem, not_before_ms: None, expected_runtime_ms: None, user_usage: 0.0, filter: GpuFilter::default(), needs: CpuRam::default() }
    }
    fn run(id: i64, gpus: &[u32], mem: Option<u64>) -> RunningJob {
        RunningJob { job_id: id, user: "ada".into(), gpus: gpus.to_vec(), gpu_memory: mem, expected_end_ms: None, needs: CpuRam::default() }
    }
    fn st(g: Vec<GpuView>, running: Vec<RunningJob>, queued: Vec<QueuedJob>) -> State {
        State { now_ms: 1000, gpus: g, running, queued, config: Config { reserve_after_ms: 10_000, ..Config::default() }, typical_wait_ms: None, host: None }
    }
    fn capped(cap: u32, mut s: State) -> State {
        s.config.max_running_gpus_per_user = Some(cap);
        s
    }
    fn bob(j: QueuedJob) -> QueuedJob {
        QueuedJob { user: "bob".into(), ..j }
    }
    /// CPU and RAM: `host` for the machine, `needs` for a job (CPUs, GiB).
    fn host(cpus: u64, gib: u64, mut s: State) -> State {
        s.host = Some(CpuRam { cpus_milli: cpus * 1000, memory: gib * G });
        s
    }
    fn needs(cpus: u64, gib: u64, j: QueuedJob) -> QueuedJob {
        QueuedJob { needs: CpuRam { cpus_milli: cpus * 1000, memory: gib * G }, ..j }
    }
    fn holds(cpus: u64, gib: u64, r: RunningJob) -> RunningJob {
        RunningJob { needs: CpuRam { cpus_milli: cpus * 1000, memory: gib * G }, ..r }
    }
    fn placed(p: &Plan) -> Vec<(i64, Vec<u32>)> {
        p.placements.iter().map(|p| (p.job_id, p.gpus.clone())).collect()
    }
    /// A lab's mixed machine: GPUs 0,1 "NVIDIA A100-PCIE-40GB", GPUs 2,3 "NVIDIA H100 80GB HBM3".
    fn mixed() -> Vec<GpuView> {
        let mut g = gpus(4, 40 * G);
        for v in &mut g[..2] {
            v.name = "NVIDIA A100-PCIE-40GB".into();
        }
        for v in &mut g[2..] {
            v.name = "NVIDIA H100 80GB HBM3".into();
            v.memory_total = 80 * G;
        }
        g
    }
    fn want(j: QueuedJob, gpu_type: Option<&str>, min: Option<u64>) -> QueuedJob {
        QueuedJob { filter: GpuFilter { gpu_type: gpu_type.map(Into::into), min_memory: min }, ..j }
    }
    /// GPUs with these links; every other pair crosses the CPU sockets.
    fn linked(mut g: Vec<GpuView>, pairs: &[(u32, u32, crate::gpu::Link)]) -> Vec<GpuView> {
        let n = g.len() as u32;
        for a in 0..n {
            for b in (0..n).filter(|b| *b != a) {
                let link = pairs.iter().find(|p| (p.0, p.1) == (a, b) || (p.1, p.0) == (a, b)).map_or(crate::gpu::Link::System, |p| p.2);
                g[a as usize].links.push(crate::gpu::GpuLink { peer: b, link });
            }
        }
        g
    }

    #[test]
    fn table() {
        struct Case {
            name: &'static str,
            state: State,
            want: Vec<(i64, Vec<u32>)>,
        }
        let cases = vec![
            Case { name: "two 1-GPU jobs on two GPUs, third waits", state: st(gpus(2, 24 * G), vec![], vec![q(1, 1, None), q(2, 1, None), q(3, 1, None)]), want: vec![(1, vec![0]), (2, vec![1])] },
            Case { name: "big job does not block a later small job", state: st(gpus(2, 24 * G), vec![run(9, &[0], None)], vec![q(1, 2, None), q(2, 1, None)]), want: vec![(2, vec![1])] },
            Case { name: "exclusive GPU is never shared", state: st(gpus(1, 24 * G), vec![run(9, &[0], None)], vec![q(1, 1, Some(G))]), want: vec![] },
            Case { name: "shared jobs pack when memory fits", state: st(gpus(1, 24 * G), vec![], vec![q(1, 1, Some(10 * G)), q(2, 1, Some(10 * G)), q(3, 1, Some(10 * G))]), want: vec![(1, vec![0]), (2, vec![0])] },
            Case { name: "whole-GPU job does not land on a shared GPU", state: st(gpus(2, 24 * G), vec![run(9, &[0], Some(G))], vec![q(1, 1, None)]), want: vec![(1, vec![1])] },
            Case { name: "best fit packs onto the fuller GPU", state: st(gpus(2, 24 * G), vec![run(9, &[1], Some(16 * G))], vec![q(1, 1, Some(4 * G))]), want: vec![(1, vec![1])] },
            Case { name: "external process makes a GPU busy", state: st({ let mut g = gpus(2, 24 * G); g[0].external_busy = true; g }, vec![], vec![q(1, 1, None), q(2, 1, Some(G))]), want: vec![(1, vec![1])] },
            Case { name: "priority beats submission order", state: st(gpus(1, 24 * G), vec![], vec![q(1, 1, None), QueuedJob { priority: 5, ..q(2, 1, None) }]), want: vec![(2, vec![0])] },
            Case { name: "cpu-only job always starts", state: st(gpus(1, 24 * G), vec![run(9, &[0], None)], vec![q(1, 0, None)]), want: vec![(1, vec![])] },
            Case { name: "retry backoff holds a job", state: st(gpus(1, 24 * G), vec![], vec![QueuedJob { not_before_ms: Some(5000), ..q(1, 1, None) }, q(2, 1, None)]), want: vec![(2, vec![0])] },
            Case { name: "user cap: ada runs 1 GPU, cap 2: one more starts, bob's job fills the rest", state: capped(2, st(gpus(4, 24 * G), vec![run(9, &[0], None)], vec![q(1, 1, None), q(2, 1, None), bob(q(3, 1, None))])), want: vec![(1, vec![1]), (3, vec![2])] },
            Case { name: "user cap counts GPUs, not jobs", state: capped(2, st(gpus(4, 24 * G), vec![], vec![q(1, 2, None), q(2, 1, Some(G)), bob(q(3, 2, None))])), want: vec![(1, vec![0, 1]), (3, vec![2, 3])] },
            Case { name: "user cap: a job larger than the cap never starts; CPU jobs are not capped", state: capped(1, st(gpus(4, 24 * G), vec![], vec![q(1, 2, None), q(2, 0, None)])), want: vec![(2, vec![])] },
            Case { name: "no cap: one user may take every GPU", state: st(gpus(2, 24 * G), vec![run(9, &[0], None)], vec![q(1, 1, None)]), want: vec![(1, vec![1])] },
            Case { name: "memory used outside Gantry adds to declared memory", state: st({ let mut g = gpus(1, 24 * G); g[0].memory_used = 13 * G; g[0].outside_used = 12 * G; g }, vec![run(9, &[0], Some(4 * G))], vec![q(1, 1, Some(10 * G))]), want: vec![] },
            Case { name: "gpu_type takes only GPUs whose name matches, any case", state: st(mixed(), vec![], vec![want(q(1, 1, None), Some("h100"), None), want(q(2, 2, None), Some("A100"), None)]), want: vec![(1, vec![2]), (2, vec![0, 1])] },
            Case { name: "min_gpu_memory skips smaller GPUs", state: st(mixed(), vec![], vec![want(q(1, 1, None), None, Some(60 * G))]), want: vec![(1, vec![2])] },
            Case { name: "filter and memory together; busy matches make it wait, later jobs still start", state: st(mixed(), vec![run(9, &[2, 3], None)], vec![want(q(1, 1, None), Some("H100"), Some(40 * G)), q(2, 1, None)]), want: vec![(2, vec![0])] },
            Case { name: "a filtered shared job packs only onto matching GPUs", state: st(mixed(), vec![run(9, &[0], Some(10 * G))], vec![want(q(1, 1, Some(10 * G)), Some("H100"), None)]), want: vec![(1, vec![2])] },
            Case { name: "no topology: lowest indexes", state: st(gpus(4, 24 * G), vec![], vec![q(1, 2, None)]), want: vec![(1, vec![0, 1])] },
            Case { name: "topology: the NVLink pair among equal free GPUs", state: st(linked(gpus(4, 24 * G), &[(0, 2, crate::gpu::Link::Nvlink), (1, 3, crate::gpu::Link::Nvlink), (0, 1, crate::gpu::Link::PcieSwitch)]), vec![], vec![q(1, 2, None)]), want: vec![(1, vec![0, 2])] },
            Case { name: "topology: same PCIe switch beats host bridge", state: st(linked(gpus(4, 24 * G), &[(1, 2, crate::gpu::Link::PcieSwitch), (0, 1, crate::gpu::Link::HostBridge), (2, 3, crate::gpu::Link::HostBridge)]), vec![run(9, &[0], None)], vec![q(1, 2, None)]), want: vec![(1, vec![1, 2])] },
            Case { name: "topology: a quad of NVLink pairs", state: st(linked(gpus(8, 24 * G), &[(0, 4, crate::gpu::Link::Nvlink), (0, 5, crate::gpu::Link::Nvlink), (4, 5, crate::gpu::Link::Nvlink), (1, 4, crate::gpu::Link::Nvlink), (0, 1, crate::gpu::Link::Nvlink), (1, 5, crate::gpu::Link::Nvlink)]), vec![], vec![q(1, 4, None)]), want: vec![(1, vec![0, 1, 4, 5])] },
            Case { name: "topology never overrides best fit: the fuller GPU stays, its NVLink peer joins", state: st(linked(gpus(4, 24 * G), &[(1, 3, crate::gpu::Link::Nvlink), (0, 2, crate::gpu::Link::Nvlink)]), vec![run(9, &[1], Some(8 * G))], vec![q(1, 2, Some(4 * G))]), want: vec![(1, vec![1, 3])] },
            Case { name: "CPU: a job needing more CPUs than are free waits; a smaller later one starts", state: host(16, 256, st(gpus(4, 24 * G), vec![holds(10, 8, run(9, &[0], None))], vec![needs(8, 8, q(1, 1, None)), needs(6, 8, q(2, 1, None))])), want: vec![(2, vec![1])] },
            Case { name: "RAM: a job needing more memory than is free waits", state: host(64, 100, st(gpus(2, 24 * G), vec![holds(1, 60, run(9, &[0], None))], vec![needs(1, 50, q(1, 1, None)), needs(1, 40, q(2, 0, None))])), want: vec![(2, vec![])] },
            Case { name: "CPU-only jobs are counted too and no longer always start", state: host(4, 64, st(gpus(1, 24 * G), vec![], vec![needs(3, 1, q(1, 0, None)), needs(3, 1, q(2, 0, None)), needs(1, 1, q(3, 1, None))])), want: vec![(1, vec![]), (3, vec![0])] },
            Case { name: "CPU: jobs placed in the same pass count against each other", state: host(8, 64, st(gpus(4, 24 * G), vec![], vec![needs(4, 1, q(1, 1, None)), needs(4, 1, q(2, 1, None)), needs(4, 1, q(3, 1, None))])), want: vec![(1, vec![0]), (2, vec![1])] },
            Case { name: "no host capacity (a trace): CPU and RAM are not counted", state: st(gpus(2, 24 * G), vec![holds(100, 100, run(9, &[0], None))], vec![needs(100, 100, q(1, 1, None))]), want: vec![(1, vec![1])] },
            Case { name: "CPU fits but no GPU: the job waits for the GPU, and no CPU is taken", state: host(8, 64, st(gpus(1, 24 * G), vec![holds(1, 1, run(9, &[0], None))], vec![needs(4, 1, q(1, 1, None)), needs(4, 1, q(2, 0, None))])), want: vec![(2, vec![])] },
            Case { name: "measured memory above declared limits sharing", state: st({ let mut g = gpus(1, 24 * G); g[0].memory_used = 20 * G; g }, vec![run(9, &[0], Some(4 * G))], vec![q(1, 1, Some(8 * G))]), want: vec![] },
        ];
        for c in cases {
            assert_eq!(placed(&plan(&c.state)), c.want, "{}", c.name);
        }
    }

    #[test]
    fn starving_big_job_gets_a_reservation() {
        // 2 GPUs, GPU 0 busy. A 2-GPU job waited past the limit: GPU 1 must not go to the small job.
        let mut s = st(gpus(2, 24 * G), vec![run(9, &[0], None)], vec![q(1, 2, None), q(2, 1, None)]);
        s.now_ms = 20_000;
        let p = plan(&s);
        assert!(p.placements.is_empty(), "{p:?}");
        let w = |id| p.waiting.iter().find(|w| w.job_id == id).unwrap();
        assert_eq!(w(1).reserved, vec![0, 1]);
        assert!(w(2).reason.contains("reserved for job 1"), "{}", w(2).reason);
        assert!(w(2).reserved.is_empty(), "only the oldest overdue job reserves");
        // Before the limit, the small job backfills.
        s.now_ms = 5_000;
        assert_eq!(placed(&plan(&s)), vec![(2, vec![1])]);
    }

    #[test]
    fn reasons_explain_the_wait() {
        let p = plan(&st(gpus(2, 24 * G), vec![run(7, &[0], None), run(8, &[1], None)], vec![q(1, 1, None), q(2, 3, None)]));
        assert_eq!(p.waiting[0].position, 1);
        assert!(p.waiting[0].reason.contains("needs 1 free GPU, 0 available"), "{}", p.waiting[0].reason);
        assert!(p.waiting[0].reason.contains("GPU 0 held by job 7; GPU 1 held by job 8"), "{}", p.waiting[0].reason);
        assert!(p.waiting[1].reason.contains("this machine has 2"), "{}", p.waiting[1].reason);
    }

    #[test]
    fn a_filtered_job_says_what_it_waits_for() {
        let p = plan(&st(mixed(), vec![run(7, &[2], None), run(8, &[3], None)], vec![want(q(1, 1, None), Some("H100"), Some(40 * G)), want(q(2, 3, None), Some("H100"), None)]));
        assert_eq!(p.waiting[0].reason, "waits for an H100 with ≥ 40.0 GiB: GPUs 2,3 match; needs 1 free GPU, 0 available (GPU 2 held by job 7; GPU 3 held by job 8)");
        assert_eq!(p.waiting[1].reason, "waits for 3 H100s: this machine has 2 such GPUs");
        // A starving filtered job reserves only GPUs it accepts.
        let mut s = st(mixed(), vec![run(7, &[0, 2], None)], vec![want(q(1, 2, None), Some("H100"), None), q(2, 1, None)]);
        s.now_ms = 60_000;
        let p = plan(&s);
        assert_eq!(p.waiting[0].reserved, vec![2, 3], "{p:?}");
        assert_eq!(placed(&p), vec![(2, vec![1])]);
    }

    #[test]
    fn the_topology_note_names_the_link() {
        use crate::gpu::Link;
        let g = linked(gpus(4, 24 * G), &[(0, 1, Link::Nvlink), (0, 2, Link::PcieSwitch), (1, 2, Link::PcieSwitch)]);
        assert_eq!(topology_note(&g, &[0, 1]).as_deref(), Some("GPUs 0,1: NVLink"));
        assert_eq!(topology_note(&g, &[0, 1, 2]).as_deref(), Some("GPUs 0,1,2: same PCIe switch or closer"));
        assert_eq!(topology_note(&g, &[0]), None);
        assert_eq!(topology_note(&gpus(2, G), &[0, 1]), None, "simulated GPUs: no topology, no note");
        assert_eq!(GpuFilter { gpu_type: Some("A100".into()), min_memory: None }.describe(1), "an A100");
        assert_eq!(GpuFilter { gpu_type: Some("Tesla".into()), min_memory: None }.describe(1), "a Tesla");
        assert_eq!(GpuFilter { gpu_type: None, min_memory: Some(60 * G) }.describe(2), "2 GPUs with ≥ 60.0 GiB");
    }

    #[test]
    fn cpu_and_ram_reasons_name_what_is_free_and_who_holds_it() {
        let alice = |r: RunningJob| RunningJob { user: "alice".into(), ..r };
        let running = vec![alice(holds(10, 20, run(12, &[0], None))), holds(2, 40, run(13, &[1], None))];
        let s = host(18, 64, st(gpus(4, 24 * G), running, vec![needs(16, 1, q(1, 1, None)), needs(1, 2, q(2, 0, None)), needs(20, 1, q(3, 0, None)), QueuedJob { needs: CpuRam { cpus_milli: 500, memory: 100 * G }, ..q(4, 0, None) }]));
        let p = plan(&s);
        let w = |id| p.waiting.iter().find(|w| w.job_id == id).map(|w| w.reason.clone()).unwrap_or_default();
        assert_eq!(w(1), "needs 16 CPUs, 6 free (alice's job 12 uses 10; ada's job 13 uses 2)");
        assert_eq!(placed(&p), vec![(2, vec![])], "the small CPU-only job starts beside them");
        assert_eq!(w(3), "needs 20 CPUs, this machine has 18 for jobs");
        assert_eq!(w(4), "needs 100.0 GiB of memory, this machine has 64.0 GiB for jobs");
        let s = host(18, 64, st(gpus(2, 24 * G), vec![alice(holds(1, 40, run(12, &[0], None)))], vec![needs(1, 30, q(1, 1, None))]));
        assert_eq!(plan(&s).waiting[0].reason, "needs 30.0 GiB of memory, 24.0 GiB free (alice's job 12 uses 40.0 GiB)");
        assert_eq!((format_cpus(500), format_cpus(333), format_cpus(16_000)), ("0.5".into(), "0.33".into(), "16".into()));
    }

    #[test]
    fn a_starving_job_short_of_cpu_waits_without_draining_gpus() {
        let mut s = host(8, 64, st(gpus(2, 24 * G), vec![holds(6, 1, run(9, &[0], None))], vec![needs(4, 1, q(1, 1, None)), needs(2, 1, q(2, 1, None))]));
        s.now_ms = 60_000;
        let p = plan(&s);
        assert_eq!(placed(&p), vec![(2, vec![1])], "{p:?}");
        assert_eq!(p.waiting[0].reason, "needs 4 CPUs, 2 free (ada's job 9 uses 6)");
        assert!(p.waiting[0].reserved.is_empty());
    }

    #[test]
    fn a_capped_user_waits_with_the_reason_and_never_reserves() {
        let mut s = capped(1, st(gpus(2, 24 * G), vec![run(9, &[0], None)], vec![q(1, 1, None), bob(q(2, 2, None))]));
        s.now_ms = 60_000; // both waited past the reservation threshold
        let p = plan(&s);
        assert!(p.placements.is_empty(), "{p:?}");
        let w = |id| p.waiting.iter().find(|w| w.job_id == id).unwrap();
        assert_eq!(w(1).reason, "ada already runs 1 GPU; the lab limit is 1 per user");
        assert!(w(1).reserved.is_empty(), "a job its own cap holds back must not drain GPUs");
        assert_eq!(w(2).reason, "asks for 2 GPUs; the lab limit is 1 GPU per user");
    }

    #[test]
    fn deterministic_regardless_of_input_order() {
        let a = st(gpus(4, 24 * G), vec![], (1..=8).map(|i| q(i, (i % 3) as u32, if i % 2 == 0 { Some(6 * G) } else { None })).collect());
        let mut b = a.clone();
        b.queued.reverse();
        b.gpus.reverse();
        assert_eq!(plan(&a), plan(&b));
    }

    #[test]
    fn never_oversubscribes() {
        // Randomized (fixed seed) check: no GPU ever gets more than its memory or a second exclusive holder.
        let mut seed = 42u64;
        let mut rnd = |m: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % m
        };
        for _ in 0..500 {
            let n = 1 + rnd(8) as u32;
            let queued: Vec<QueuedJob> = (1..=(1 + rnd(12) as i64))
                .map(|i| q(i, rnd(n as u64 + 1) as u32, if rnd(2) == 0 { Some((1 + rnd(24)) * G) } else { None }))
                .collect();
            let p = plan(&st(gpus(n, 24 * G), vec![], queued.clone()));
            let mut excl = vec![0; n as usize];
            let mut mem = vec![0u64; n as usize];
            for pl in &p.placements {
                let j = queued.iter().find(|j| j.job_id == pl.job_id).unwrap();
                assert_eq!(pl.gpus.len(), j.gpus as usize);
                for g in &pl.gpus {
                    match j.gpu_memory {
                        None => excl[*g as usize] += 1,
                        Some(m) => mem[*g as usize] += m,
                    }
                }
            }
            for g in 0..n as usize {
                assert!(excl[g] <= 1 && (excl[g] == 0 || mem[g] == 0) && mem[g] <= 24 * G);
            }
        }
    }
}

/// Estimated start time of each queued job: replay `plan` forward on a virtual clock, assuming each
/// job runs for its expected runtime (`default_runtime_ms` when unknown) and nothing new arrives.
pub fn estimate_starts(state: &State, default_runtime_ms: i64, max_steps: usize) -> std::collections::HashMap<i64, i64> {
    let mut out = std::collections::HashMap::new();
    let mut s = state.clone();
    s.config.explain_first = 0;
    for r in &mut s.running {
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
                s.running.push(RunningJob { job_id: q.job_id, user: q.user.clone(), gpus: pl.gpus.clone(), gpu_memory: q.gpu_memory, expected_end_ms: Some(s.now_ms + rt), needs: q.needs });
            }
        }
        // Jump to the next end (or backoff expiry), when something can change.
        let next_end = s.running.iter().filter_map(|r| r.expected_end_ms).filter(|e| *e > s.now_ms).min();
        let next_nb = s.queued.iter().filter_map(|q| q.not_before_ms).filter(|t| *t > s.now_ms).min();
        let Some(next) = [next_end, next_nb].into_iter().flatten().min() else { break };
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
    fn start_estimates_follow_the_running_jobs_ends() {
        let g = |i| GpuView { index: i, memory_total: 1 << 34, ..Default::default() };
        let q = |id, gpus, rt: Option<i64>| QueuedJob { job_id: id, user: String::new(), priority: 0, submitted_at_ms: id, gpus, gpu_memory: None, not_before_ms: None, expected_runtime_ms: rt, user_usage: 0.0, filter: GpuFilter::default(), needs: CpuRam::default() };
        let s = State {
            now_ms: 0,
            gpus: vec![g(0), g(1)],
            running: vec![RunningJob { job_id: 9, user: String::new(), gpus: vec![0], gpu_memory: None, expected_end_ms: Some(1_000), needs: CpuRam::default() }],
            queued: vec![q(1, 1, Some(5_000)), q(2, 2, Some(100)), q(3, 1, None)],
            config: Config { reserve_after_ms: i64::MAX, ..Config::default() },
            typical_wait_ms: None,
            host: None,
        };
        let e = estimate_starts(&s, 60_000, 100);
        assert_eq!(e[&1], 0); // GPU 1 is free now
        assert_eq!(e[&3], 1_000); // GPU 0 frees at 1 s
        assert_eq!(e[&2], 61_000); // needs both: after job 3's assumed 60 s
    }
}

#[cfg(test)]
mod drain_tests {
    use super::*;
    const G: u64 = 1 << 30;

    fn gpus(n: u32) -> Vec<GpuView> {
        (0..n).map(|i| GpuView { index: i, memory_total: 32 * G, ..Default::default() }).collect()
    }
    fn q(id: i64, gpus: u32, rt: Option<i64>, at: i64) -> QueuedJob {
        QueuedJob { job_id: id, user: "ada".into(), priority: 0, submitted_at_ms: at, gpus, gpu_memory: None, not_before_ms: None, expected_runtime_ms: rt, user_usage: 0.0, filter: GpuFilter::default(), needs: CpuRam::default() }
    }
    fn run(id: i64, gpu: u32, end: i64) -> RunningJob {
        RunningJob { job_id: id, user: "ada".into(), gpus: vec![gpu], gpu_memory: None, expected_end_ms: Some(end), needs: CpuRam::default() }
    }

    #[test]
    fn short_jobs_backfill_a_drain() {
        let h = 3_600_000;
        let running: Vec<RunningJob> = (0..7).map(|g| run(100 + g as i64, g, 1000 * h)).collect();
        let s = State { now_ms: 100 * h, gpus: gpus(8), running, queued: vec![q(1, 8, Some(h), 0), q(2, 1, Some(h), 50 * h)], config: Config { reserve_after_ms: h, drain_limit_factor: None, ..Config::default() }, typical_wait_ms: Some(10 * h), host: None };
        let p = plan(&s);
        assert_eq!(p.waiting[0].reserved.len(), 8, "{p:?}");
        assert_eq!(p.placements, vec![Placement { job_id: 2, gpus: vec![7] }], "{p:?}");
    }
}

#[cfg(test)]
mod fgd_and_reservation_tests {
    use super::*;
    const G: u64 = 1 << 30;
    const H: i64 = 3_600_000;

    fn gpus(n: u32) -> Vec<GpuView> {
        (0..n).map(|i| GpuView { index: i, memory_total: 32 * G, ..Default::default() }).collect()
    }
    fn q(id: i64, gpus: u32, mem: Option<u64>, at: i64, rt: Option<i64>) -> QueuedJob {
        QueuedJob { job_id: id, user: "ada".into(), priority: 0, submitted_at_ms: at, gpus, gpu_memory: mem, not_before_ms: None, expected_runtime_ms: rt, user_usage: 0.0, filter: GpuFilter::default(), needs: CpuRam::default() }
    }
    fn run(id: i64, gpus: &[u32], mem: Option<u64>, end: Option<i64>) -> RunningJob {
        RunningJob { job_id: id, user: "ada".into(), gpus: gpus.to_vec(), gpu_memory: mem, expected_end_ms: end, needs: CpuRam::default() }
    }
    fn state(n: u32, running: Vec<RunningJob>, queued: Vec<QueuedJob>, now: i64) -> State {
        // The mechanisms one at a time: aging on, no drain limit (the defaults are tested below).
        State { now_ms: now, gpus: gpus(n), running, queued, config: Config { reserve_after_ms: H, age_narrow: true, drain_limit_factor: None, ..Config::default() }, typical_wait_ms: Some(H), host: None }
    }

    #[test]
    fn fragmentation_by_hand() {
        // GPU 0: 16 GiB free (a shared job there), GPU 1: empty. Shapes: half 1x16 GiB, half whole GPUs.
        let view = [(16 * G, false, 32 * G), (32 * G, true, 32 * G)];
        let half = |m: Option<u64>| Shape { gpus: 1, gpu_memory: m, weight: 0.5 };
        // 16 GiB jobs fit on both GPUs: no fragment. A whole-GPU job fits on GPU 1 only: GPU 0's 16 GiB is a fragment.
        assert_eq!(fragmentation(&view, &half(Some(16 * G))), 0);
        assert_eq!(fragmentation(&view, &half(None)), 16 * G);
        assert_eq!(expected_fragmentation(&view, &[half(Some(16 * G)), half(None)]), 8.0 * G as f64);
        // An 8 GiB job on GPU 1 leaves no empty GPU: a whole-GPU job fits nowhere, all 40 GiB free are fragments.
        let after = [(16 * G, false, 32 * G), (24 * G, false, 32 * G)];
        assert_eq!(fragmentation(&after, &half(None)), 40 * G);
        // A 2-GPU whole shape on a machine with one empty GPU: cannot host it, everything free counts.
        assert_eq!(fragmentation(&view, &Shape { gpus: 2, gpu_memory: None, weight: 1.0 }), 48 * G);
    }

    #[test]
    fn fgd_keeps_room_for_the_common_shape_where_best_fit_does_not() {
        // GPU 0 has 12 GiB free, GPU 1 has 9 GiB. A 4 GiB job arrives; recent requests are all 8 GiB.
        // Best fit: GPU 1 (5 GiB left, too little for an 8 GiB job: +5 GiB of fragments). FGD: GPU 0
        // (8 GiB left, still serves an 8 GiB job: no new fragment).
        let running = vec![run(8, &[0], Some(20 * G), None), run(9, &[1], Some(23 * G), None)];
        let mut s = state(2, running, vec![q(1, 1, Some(4 * G), 0, None)], 0);
        s.config.shapes = vec![Shape { gpus: 1, gpu_memory: Some(8 * G), weight: 1.0 }];
        s.config.packing = Packing::BestFit;
        assert_eq!(plan(&s).placements[0].gpus, vec![1]);
        s.config.packing = Packing::Fgd;
        assert_eq!(plan(&s).placements[0].gpus, vec![0]);
        // FGD with no known mix is best fit.
        s.config.shapes.clear();
        assert_eq!(plan(&s).placements[0].gpus, vec![1]);
        assert_eq!(shape_mix([(1, Some(8 * G)), (1, Some(8 * G)), (2, None), (0, None)]), vec![Shape { gpus: 1, gpu_memory: Some(8 * G), weight: 2.0 / 3.0 }, Shape { gpus: 2, gpu_memory: None, weight: 1.0 / 3.0 }]);
    }

    #[test]
    fn reservation_decisions() {
        struct Case {
            name: &'static str,
            state: State,
            /// (job, reserved GPUs) for every job that holds a reservation; placements.
            reserved: Vec<(i64, Vec<u32>)>,
            placed: Vec<i64>,
        }
        let busy = |end: i64| vec![run(9, &[0], None, Some(end))];
        let shared = || vec![run(7, &[0, 1], None, Some(6 * H)), run(6, &[2], None, Some(100 * H))];
        let limited = |mut s: State, f: f64| {
            s.config.drain_limit_factor = Some(f);
            s
        };
        let cases = vec![
            Case { name: "a wide job past the threshold reserves; a short job backfills the free GPU", state: state(2, busy(10 * H), vec![q(1, 2, None, 0, Some(H)), q(2, 1, None, 5 * H, Some(H))], 5 * H), reserved: vec![(1, vec![0, 1])], placed: vec![2] },
            Case { name: "a job that would outlast the drain may not backfill", state: state(2, busy(10 * H), vec![q(1, 2, None, 0, Some(H)), q(2, 1, None, 5 * H, Some(20 * H))], 5 * H), reserved: vec![(1, vec![0, 1])], placed: vec![] },
            Case { name: "unknown runtimes never backfill a drain", state: state(2, busy(10 * H), vec![q(1, 2, None, 0, Some(H)), q(2, 1, None, 5 * H, None)], 5 * H), reserved: vec![(1, vec![0, 1])], placed: vec![] },
            Case { name: "a wide job before the threshold (3 x typical wait) reserves nothing", state: state(2, busy(10 * H), vec![q(1, 2, None, 0, Some(H)), q(2, 1, None, 0, Some(50 * H))], 2 * H), reserved: vec![], placed: vec![2] },
            Case { name: "an overdue 1-GPU job reserves nothing", state: state(2, vec![run(9, &[0], None, Some(10 * H)), run(8, &[1], None, Some(20 * H))], vec![q(1, 1, None, 0, Some(H))], 5 * H), reserved: vec![], placed: vec![] },
            Case { name: "an overdue 1-GPU job goes before a younger shorter one", state: state(2, busy(10 * H), vec![q(1, 1, None, 0, Some(50 * H)), q(2, 1, None, 4 * H, Some(H))], 5 * H), reserved: vec![], placed: vec![1] },
            Case { name: "drain limit: a drain expected to take longer than the job's wait is not started", state: limited(state(2, busy(100 * H), vec![q(1, 2, None, 0, Some(H)), q(2, 1, None, 5 * H, Some(500 * H))], 5 * H), 1.0), reserved: vec![], placed: vec![2] },
            Case { name: "defaults: an overdue 1-GPU job reserves the GPU that frees first, when it frees soon", state: { let mut s = state(2, vec![run(9, &[0], None, Some(7 * H)), run(8, &[1], None, Some(20 * H))], vec![q(1, 1, None, 0, Some(H)), q(2, 1, None, 4 * H, Some(H))], 5 * H); s.config.age_narrow = false; s.config.drain_limit_factor = Some(1.0); s }, reserved: vec![(1, vec![0])], placed: vec![] },
            Case { name: "defaults: ...and not when that takes longer than it waited", state: { let mut s = state(2, vec![run(9, &[0], None, Some(70 * H)), run(8, &[1], None, Some(20 * H))], vec![q(1, 1, None, 0, Some(H))], 5 * H); s.config.age_narrow = false; s.config.drain_limit_factor = Some(1.0); s }, reserved: vec![], placed: vec![] },
            Case { name: "drain limit: a short drain is", state: limited(state(2, busy(8 * H), vec![q(1, 2, None, 0, Some(H)), q(2, 1, None, 5 * H, Some(500 * H))], 5 * H), 1.0), reserved: vec![(1, vec![0, 1])], placed: vec![] },
            // GPUs 0,1: a 2-GPU job ending at 6 h; GPU 2: a long job; GPU 3: free.
            Case { name: "a wide job shares the drain of the wide job running: it reserves before its threshold", state: state(4, shared(), vec![q(1, 2, None, 5 * H, Some(H)), q(2, 1, None, 5 * H, Some(5 * H))], 5 * H), reserved: vec![(1, vec![0, 3])], placed: vec![] },
            Case { name: "...and without shared drains it waits its turn", state: { let mut s = state(4, shared(), vec![q(1, 2, None, 5 * H, Some(H)), q(2, 1, None, 5 * H, Some(5 * H))], 5 * H); s.config.share_drains = false; s }, reserved: vec![], placed: vec![2] },
        ];
        for c in cases {
            let p = plan(&c.state);
            let reserved: Vec<(i64, Vec<u32>)> = p.waiting.iter().filter(|w| !w.reserved.is_empty()).map(|w| (w.job_id, w.reserved.clone())).collect();
            let placed: Vec<i64> = p.placements.iter().map(|p| p.job_id).collect();
            assert_eq!((reserved, placed), (c.reserved, c.placed), "{}", c.name);
        }
    }
}
