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
pub use crate::units::format_cpus;
use serde::{Deserialize, Serialize};

mod book;
mod cpu_only;
mod eta;
mod explain;
mod fit;
mod keep;
mod order;
mod pending;
mod preempt;
mod reserve;
mod soon;
pub use book::*;
pub use eta::*;
use explain::*;
pub use fit::*;
pub use keep::*;
pub use order::*;
pub use pending::*;
pub use preempt::*;
use reserve::*;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    pub index: u32,
    pub memory_total: u64,
    /// Memory in use as measured (all processes).
    pub memory_used: u64,
    /// Processes outside Gantry use this GPU (someone's notebook): it is busy.
    pub external_busy: bool,
    /// Since when that outside use has been seen without a break (`None`: unknown, counted as just
    /// now). Only use that has lasted [`crate::defaults::OUTSIDE_SETTLE_MS`] makes a job that needs
    /// the GPU give up its reservation and claims ([`outside_blocks`]): a just-stopped job's process
    /// may still be listed until the next sample.
    #[serde(default)]
    pub outside_since_ms: Option<i64>,
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
    /// What preemption needs to know of it; `None`: not preemptible (never a victim).
    #[serde(default)]
    pub victim: Option<Victim>,
    /// Its declared runtime and this attempt's start, when it declared one: once it has outlived the
    /// declaration by the lab's margin ([`Config::overrun_margin_ms`], see [`overran_ms`]) its end is
    /// no longer trusted (see docs/scheduling.md, "Lying runtimes").
    #[serde(default)]
    pub declared: Option<Declared>,
}

/// A running job's promise: it started at `started_ms` and said it would run `runtime_ms`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Declared {
    pub started_ms: i64,
    pub runtime_ms: i64,
}

/// The margin past a declared runtime before a job counts as overrunning it: the lab's
/// `overrun_margin`, or a tenth of the declaration when that is longer (a 10-hour job 20 minutes
/// late misjudged its data, it did not lie).
pub fn overrun_margin_ms(declared_ms: i64, margin_ms: i64) -> i64 {
    margin_ms.max(declared_ms / crate::defaults::OVERRUN_FRACTION_DIV)
}

/// How far `r` has run past its declared runtime, once that is more than the margin (it broke its
/// promise for this attempt); `None` while it keeps it, or when it declared none.
pub fn overran_ms(r: &RunningJob, now: i64, margin_ms: i64) -> Option<i64> {
    let d = r.declared?;
    let past = now - d.started_ms - d.runtime_ms;
    (past > overrun_margin_ms(d.runtime_ms, margin_ms)).then_some(past)
}

/// "job 12 ran 53s past its declared 1s runtime".
pub(super) fn overran_note(r: &RunningJob, past_ms: i64) -> String {
    let declared = r.declared.map_or(0, |d| d.runtime_ms);
    format!(
        "job {} ran {} past its declared {} runtime",
        r.job_id,
        crate::units::duration_ms(past_ms),
        crate::units::duration_ms(declared)
    )
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
    /// When it was last preempted (it went back to its place in the queue): its wait toward a
    /// reservation or a preemption counts from then, so a preempted job does not preempt back.
    #[serde(default)]
    pub preempted_at_ms: Option<i64>,
}

/// CPU (thousandths) and RAM (bytes): a job's limits, or what the machine has for jobs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuRam {
    pub cpus_milli: u64,
    pub memory: u64,
}

impl CpuRam {
    /// Both measures added (saturating).
    pub fn plus(self, o: CpuRam) -> CpuRam {
        CpuRam {
            cpus_milli: self.cpus_milli.saturating_add(o.cpus_milli),
            memory: self.memory.saturating_add(o.memory),
        }
    }
}

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
    /// The CPU and RAM one GPU comes with (the lab's per-GPU share): a job's CPU/RAM counts, in the
    /// per-user cap, as that many GPUs' shares when it is more than its GPUs' (a CPU-only job too).
    /// `None`: GPUs alone count.
    #[serde(default)]
    pub gpu_share: Option<CpuRam>,
    /// What CPU-only jobs together may hold (lab `[containers] cpu_only_shares`, see [`cpu_only`]);
    /// `None`: not bounded (the simulator).
    #[serde(default)]
    pub cpu_only_limit: Option<CpuRam>,
    /// The recent mix of request shapes, for FGD packing (empty: best fit). Part of the pass's
    /// input rather than a setting: the engine and the simulator fill it from recent submissions.
    #[serde(default)]
    pub shapes: Vec<Shape>,
    /// Preemption (lab `[preemption]`): `None` = off, the default.
    #[serde(default)]
    pub preemption: Option<PreemptRules>,
    /// GPUs freed by preemption for a job that has not started yet: reserved for it, so the jobs
    /// ahead of it in the order do not take what was freed for it. Part of the pass's input (the
    /// engine and the simulator keep them from the plan's `preempt` until the job starts).
    #[serde(default)]
    pub claims: Vec<(i64, Vec<u32>)>,
    /// Open GPU bookings (`gantry book`, see [`book`]). Part of the pass's input.
    #[serde(default)]
    pub bookings: Vec<BookHold>,
    /// Queued jobs that would be preemptible once running: they may go on a booking's GPUs before
    /// its start whatever their length.
    #[serde(default)]
    pub preemptible: Vec<i64>,
    /// Queued jobs without a declared runtime: a cautious learned one (p95), which a booking's
    /// "expected to end by its start" uses instead of the median in `expected_runtime_ms`.
    #[serde(default)]
    pub cautious_runtimes: Vec<(i64, i64)>,
    /// Queued jobs without a declared runtime whose learned one is not their own (from other jobs'
    /// runs, not their owner's of that name and shape): not trusted to end before a booking.
    #[serde(default)]
    pub unproven_runtimes: Vec<i64>,
    /// A running job that outlived its declared runtime by this much (or a tenth of it, if longer)
    /// broke its promise: its end is unknown from then on (nothing more backfills on it), and, if
    /// preemptible, it may be preempted for the reservation it blocks (lab `[jobs] overrun_margin`).
    #[serde(default = "overrun_margin_default")]
    pub overrun_margin_ms: i64,
}

fn overrun_margin_default() -> i64 {
    crate::defaults::OVERRUN_MARGIN.as_millis() as i64
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
    counts
        .into_iter()
        .map(|((gpus, gpu_memory), c)| Shape {
            gpus,
            gpu_memory,
            weight: c / total,
        })
        .collect()
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
            gpu_share: None,
            cpu_only_limit: None,
            shapes: vec![],
            preemption: None,
            claims: vec![],
            bookings: vec![],
            preemptible: vec![],
            cautious_runtimes: vec![],
            unproven_runtimes: vec![],
            overrun_margin_ms: overrun_margin_default(),
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
    /// The reason, or "waiting behind N other jobs" ([`Behind`]) where the plan wrote none.
    pub fn why(&self) -> String {
        if self.reason.is_empty() {
            Behind(self.position.saturating_sub(1)).to_string()
        } else {
            self.reason.clone()
        }
    }
}

/// "waiting behind N other jobs": why a job past `explain_first` waits.
pub struct Behind(pub usize);

impl std::fmt::Display for Behind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "waiting behind {} other jobs", self.0)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub placements: Vec<Placement>,
    pub waiting: Vec<Waiting>,
    /// Running jobs to stop and requeue so that waiting jobs can start (see [`preempt`]).
    #[serde(default)]
    pub preempt: Vec<Preempt>,
}

#[derive(Debug, Clone)]
struct Slot {
    index: u32,
    name: String,
    total: u64,
    measured_used: u64,
    outside_used: u64,
    external: bool,
    /// The outside use has lasted [`crate::defaults::OUTSIDE_SETTLE_MS`]: someone's work, not the
    /// stale sample of a job that just ended (which a reservation may still count on).
    external_settled: bool,
    exclusive_by: Option<i64>,
    shared_declared: u64,
    shared_jobs: Vec<i64>,
    /// Expected end of each Gantry job on this GPU (`None`: unknown).
    ends: Vec<Option<i64>>,
    /// Reserved for (job, the time that job is expected to start, if known).
    reserved_by: Option<(i64, Option<i64>)>,
    /// Bookings holding this GPU this pass.
    booked: Vec<book::Held>,
}

impl Slot {
    fn free_for_shared(&self) -> u64 {
        self.total
            .saturating_sub((self.shared_declared + self.outside_used).max(self.measured_used))
    }
    fn is_empty(&self) -> bool {
        self.exclusive_by.is_none() && self.shared_jobs.is_empty()
    }
    /// When this GPU is expected to be free of Gantry jobs (`None`: unknown).
    fn free_at(&self, now: i64) -> Option<i64> {
        self.ends.iter().try_fold(now, |acc, e| e.map(|e| acc.max(e)))
    }
}

/// What a job holds in GPUs' worth: its GPUs, or its CPU or RAM in per-GPU shares if that is
/// more (a job asking for 4 GPUs' CPUs with 1 GPU idles the 3 others as surely as holding them).
pub fn gpu_worth(gpus: u32, needs: CpuRam, share: Option<CpuRam>) -> f64 {
    let Some(s) = share else { return gpus as f64 };
    let part = |n: u64, s: u64| if s == 0 { 0.0 } else { n as f64 / s as f64 };
    (gpus as f64)
        .max(part(needs.cpus_milli, s.cpus_milli))
        .max(part(needs.memory, s.memory))
}

/// GPUs (and CPU/RAM, in GPUs' worth) each user's jobs hold, against the lab's per-user cap.
struct UserCaps<'a> {
    cap: Option<u32>,
    share: Option<CpuRam>,
    held: std::collections::HashMap<&'a str, f64>,
}

impl<'a> UserCaps<'a> {
    fn new(state: &'a State) -> Self {
        let cap = state.config.max_running_gpus_per_user;
        let share = state.config.gpu_share;
        let mut held = std::collections::HashMap::new();
        if cap.is_some() {
            for r in &state.running {
                *held.entry(r.user.as_str()).or_default() += gpu_worth(r.gpus.len() as u32, r.needs, share);
            }
        }
        UserCaps { cap, share, held }
    }
    /// Why `job` may not start now because of its owner's cap.
    fn over(&self, job: &QueuedJob) -> Option<String> {
        let worth = gpu_worth(job.gpus, job.needs, self.share);
        let cap = self.cap.filter(|_| worth > 0.0)?;
        let held = self.held.get(job.user.as_str()).copied().unwrap_or(0.0);
        // A hair of slack: shares are whole thousandths of a CPU and whole bytes.
        if held + worth <= cap as f64 + 1e-6 {
            return None;
        }
        let plural = |n: f64| if (n - 1.0).abs() < 1e-9 { "" } else { "s" };
        let n = |v: f64| {
            if (v - v.round()).abs() < 1e-6 {
                format!("{}", v.round())
            } else {
                format!("{v:.1}")
            }
        };
        Some(if held == 0.0 && worth > job.gpus as f64 + 1e-6 {
            format!("its CPU or RAM is {} GPUs' share; the lab limit is {cap} GPU{} per user (CPU and RAM count as the GPUs they keep from others)", n(worth), plural(cap as f64))
        } else if held == 0.0 {
            format!(
                "asks for {} GPUs; the lab limit is {cap} GPU{} per user",
                job.gpus,
                plural(cap as f64)
            )
        } else if (held - held.round()).abs() < 1e-6 && worth <= job.gpus as f64 + 1e-6 {
            format!(
                "{} already runs {} GPU{}; the lab limit is {cap} per user",
                job.user,
                n(held),
                plural(held)
            )
        } else {
            format!("{} already holds {} GPUs' worth (GPUs, and CPU or RAM in per-GPU shares); the lab limit is {cap} per user", job.user, n(held))
        })
    }
    fn took(&mut self, job: &'a QueuedJob) {
        if self.cap.is_some() {
            *self.held.entry(job.user.as_str()).or_default() += gpu_worth(job.gpus, job.needs, self.share);
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
    /// What CPU-only jobs hold (running, and placed this pass), and which hold it.
    cpu_only: CpuRam,
    cpu_only_by: Vec<(&'a str, i64, CpuRam)>,
    /// The CPU/RAM of queued jobs that preempted (their claims, [`Config::claims`]): kept for them
    /// until they start, as their GPUs are, so what a preemption freed is not taken by another job.
    claimed: Vec<(&'a str, i64, CpuRam)>,
}

impl<'a> Pool<'a> {
    fn new(state: &'a State) -> Self {
        let holders: Vec<(&str, i64, CpuRam)> = state
            .running
            .iter()
            .map(|r| (r.user.as_str(), r.job_id, r.needs))
            .collect();
        let cap = state.host.unwrap_or_default();
        let free = state.host.map(|c| CpuRam {
            cpus_milli: c
                .cpus_milli
                .saturating_sub(holders.iter().map(|h| h.2.cpus_milli).sum()),
            memory: c.memory.saturating_sub(holders.iter().map(|h| h.2.memory).sum()),
        });
        let cpu_only_by: Vec<(&str, i64, CpuRam)> = state
            .running
            .iter()
            .filter(|r| r.gpus.is_empty())
            .map(|r| (r.user.as_str(), r.job_id, r.needs))
            .collect();
        let claimed = state
            .config
            .claims
            .iter()
            .filter_map(|(id, _)| state.queued.iter().find(|q| q.job_id == *id))
            .filter(|q| outside_blocks(state, q).is_none())
            .map(|q| (q.user.as_str(), q.job_id, q.needs))
            .collect();
        Pool {
            free,
            cap,
            holders,
            cpu_only: cpu_only_by.iter().fold(CpuRam::default(), |a, h| a.plus(h.2)),
            cpu_only_by,
            claimed,
        }
    }

    /// What is free for `job`: the free CPU/RAM less what is kept for other jobs' claims.
    fn free_for(&self, job: &QueuedJob) -> Option<CpuRam> {
        let free = self.free?;
        let kept = self
            .claimed
            .iter()
            .filter(|c| c.1 != job.job_id)
            .fold(CpuRam::default(), |a, c| a.plus(c.2));
        Some(CpuRam {
            cpus_milli: free.cpus_milli.saturating_sub(kept.cpus_milli),
            memory: free.memory.saturating_sub(kept.memory),
        })
    }

    /// Why `job`'s CPU or RAM does not fit now (empty when not `explain`ed).
    fn lacks(&self, job: &QueuedJob, explain: bool) -> Option<String> {
        let free = self.free_for(job)?;
        let n = job.needs;
        let cpu = n.cpus_milli > free.cpus_milli;
        if !cpu && n.memory <= free.memory {
            return None;
        }
        if !explain {
            return Some(String::new());
        }
        let (pick, what, fmt): Measure = if cpu {
            (
                |c| c.cpus_milli,
                if n.cpus_milli == 1000 { "CPU" } else { "CPUs" },
                format_cpus,
            )
        } else {
            (|c| c.memory, "of memory", crate::units::format_bytes)
        };
        if pick(&n) > pick(&self.cap) {
            return Some(format!(
                "needs {} {what}, this machine has {} for jobs",
                fmt(pick(&n)),
                fmt(pick(&self.cap))
            ));
        }
        let mut by: Vec<&(&str, i64, CpuRam)> = self.holders.iter().filter(|h| pick(&h.2) > 0).collect();
        by.sort_by_key(|h| (std::cmp::Reverse(pick(&h.2)), h.1));
        let mut who: Vec<String> = by
            .iter()
            .take(3)
            .map(|(u, id, c)| format!("{u}'s job {id} uses {}", fmt(pick(c))))
            .collect();
        if by.len() > 3 {
            who.push(format!("{} more jobs", by.len() - 3));
        }
        for (u, id, c) in self.claimed.iter().filter(|c| c.1 != job.job_id && pick(&c.2) > 0) {
            who.push(format!(
                "{} kept for {u}'s job {id}, which preempted for it",
                fmt(pick(c))
            ));
        }
        Some(format!(
            "needs {} {what}, {} free ({})",
            fmt(pick(&n)),
            fmt(pick(&free)),
            who.join("; ")
        ))
    }

    fn took(&mut self, job: &'a QueuedJob) {
        if let Some(f) = &mut self.free {
            f.cpus_milli = f.cpus_milli.saturating_sub(job.needs.cpus_milli);
            f.memory = f.memory.saturating_sub(job.needs.memory);
            self.holders.push((job.user.as_str(), job.job_id, job.needs));
            self.claimed.retain(|c| c.1 != job.job_id);
            if job.gpus == 0 {
                self.cpu_only = self.cpu_only.plus(job.needs);
                self.cpu_only_by.push((job.user.as_str(), job.job_id, job.needs));
            }
        }
    }
}

/// Why `job`'s CPU or RAM does not fit now: the machine's, and for a CPU-only job what CPU-only work
/// may hold ([`cpu_only`]).
fn short(state: &State, pool: &Pool, slots: &[Slot], job: &QueuedJob, explain: bool) -> Option<String> {
    pool.lacks(job, explain).or_else(|| match job.gpus {
        0 => cpu_only::over(state, pool, slots, job, explain),
        _ => None,
    })
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
            external_settled: g.external_busy
                && state.now_ms - g.outside_since_ms.unwrap_or(state.now_ms) >= crate::defaults::OUTSIDE_SETTLE_MS,
            exclusive_by: None,
            shared_declared: 0,
            shared_jobs: vec![],
            ends: vec![],
            reserved_by: None,
            booked: vec![],
        })
        .collect();
    slots.sort_by_key(|s| s.index);
    let booked = if state.config.bookings.is_empty() {
        vec![]
    } else {
        assign(state)
    };
    book::mark(&mut slots, state, &booked);
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
                // A job past its declared runtime (and the margin) broke its promise: its end is
                // unknown from now on, so no reservation's start rests on it and nothing backfills.
                let trusted = overran_ms(r, state.now_ms, state.config.overrun_margin_ms).is_none();
                s.ends.push(r.expected_end_ms.filter(|_| trusted));
            }
        }
    }
    for (job, gpus) in &state.config.claims {
        // A claim for a job that cannot start while GPUs are used outside this engine is not kept:
        // it would idle the others for as long as that use lasts.
        if state
            .queued
            .iter()
            .any(|q| q.job_id == *job && outside_blocks(state, q).is_none())
        {
            for s in slots
                .iter_mut()
                .filter(|s| gpus.contains(&s.index) && s.reserved_by.is_none())
            {
                s.reserved_by = Some((*job, None));
            }
        }
    }
    let ctx = Ctx {
        now: state.now_ms,
        use_runtimes: state.config.use_runtimes,
        packing: state.config.packing,
        topology: Topology::of(&state.gpus),
        shapes: &state.config.shapes,
        preemptible: &state.config.preemptible,
        cautious: &state.config.cautious_runtimes,
        unproven: &state.config.unproven_runtimes,
        min_run: state.config.preemption.clone().unwrap_or_default().min_run_ms,
    };
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
            Ok(_) if short(state, &pool, &slots, job, false).is_some() => {
                let reason = short(state, &pool, &slots, job, true).unwrap_or_default();
                reserved_for = Some((job.job_id, vec![], reason))
            }
            Ok(chosen) => {
                take(&mut slots, job, &chosen, &ctx);
                caps.took(job);
                pool.took(job);
                out.placements.push(Placement {
                    job_id: job.job_id,
                    gpus: chosen,
                });
            }
            Err(reason) => {
                let mut trial = slots.clone();
                let reserved = reserve(&mut trial, job, &ctx);
                let shadow = trial
                    .iter()
                    .find_map(|s| s.reserved_by.filter(|r| r.0 == job.job_id).and_then(|r| r.1));
                let waited = state.now_ms - job.submitted_at_ms;
                let limit = state
                    .config
                    .drain_limit_factor
                    .map(|f| (state.typical_wait_ms.unwrap_or(0).max(waited) as f64 * f) as i64);
                match (limit, shadow) {
                    (Some(limit), Some(sh)) if sh - state.now_ms > limit => {
                        // Draining would idle GPUs for longer than it is worth: wait without a reservation.
                        let reason = format!(
                            "{reason}; not reserving GPUs yet: they are expected to drain in {}",
                            crate::units::duration_ms(sh - state.now_ms)
                        );
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
                    let mut r = format!(
                        "{reason}; waited {}, so GPUs {} are reserved for it",
                        crate::units::duration_ms(waited),
                        list(&reserved)
                    );
                    for note in overrunning(state, &reserved) {
                        r.push_str("; ");
                        r.push_str(&note);
                    }
                    r
                };
                push_wait(&mut out, job.job_id, reason, reserved);
            }
            continue;
        }
        if let Some(nb) = job.not_before_ms {
            if nb > state.now_ms {
                let secs = (nb - state.now_ms + 999) / 1000;
                let reason = if explain(&out) {
                    format!("retrying after a failure in {secs}s")
                } else {
                    String::new()
                };
                push_wait(&mut out, job.job_id, reason, vec![]);
                continue;
            }
        }
        let explained = explain(&out);
        // Past `explain_first`: no reason string (`Waiting::why` says "waiting behind N other jobs").
        let behind = |_: &Plan, reason: String| if explained { reason } else { String::new() };
        if job.gpus == 0 {
            match short(state, &pool, &slots, job, explained) {
                Some(reason) => {
                    let reason = behind(&out, reason);
                    push_wait(&mut out, job.job_id, reason, vec![]);
                }
                None => {
                    pool.took(job);
                    out.placements.push(Placement {
                        job_id: job.job_id,
                        gpus: vec![],
                    });
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
                out.placements.push(Placement {
                    job_id: job.job_id,
                    gpus: chosen,
                });
            }
            Err(reason) => {
                let reason = match outside_blocks(state, job) {
                    Some(note) if explained => format!("{reason}; {note}"),
                    _ => reason,
                };
                let reason = behind(&out, reason);
                push_wait(&mut out, job.job_id, reason, vec![]);
            }
        }
    }
    if let Some(rules) = &state.config.preemption {
        // Reasons only where the plan explains (the simulator and the ETA runs do not).
        let before = (state.config.explain_first > 0).then(|| (slots.clone(), out.clone()));
        preempt::decide(
            state,
            rules,
            &mut slots,
            &pool,
            &ctx,
            starving.map(|s| s.job_id),
            &mut out,
        );
        if let Some((slots_before, out_before)) = before {
            soon::say_will_preempt(
                state,
                rules,
                &slots_before,
                &out_before,
                &pool,
                &ctx,
                starving.map(|s| s.job_id),
                &mut out,
            );
        }
    }
    book::preempt_for(state, &booked, &mut out);
    out
}

/// Why `job` cannot start while GPUs stay used outside this engine: fewer GPUs it accepts are free
/// of outside use than it asks for (though the machine has enough). Such a job reserves nothing,
/// keeps no claim and preempts no one (all of which would idle GPUs for as long as that use lasts);
/// it waits in the queue like any job and starts once the outside use ends.
pub(super) fn outside_blocks(state: &State, job: &QueuedJob) -> Option<String> {
    let accepted: Vec<&GpuView> = state
        .gpus
        .iter()
        .filter(|g| job.filter.eligible(&g.name, g.memory_total))
        .collect();
    let settled = |g: &GpuView| {
        g.external_busy
            && state.now_ms - g.outside_since_ms.unwrap_or(state.now_ms) >= crate::defaults::OUTSIDE_SETTLE_MS
    };
    let outside: Vec<&GpuView> = accepted.iter().copied().filter(|g| settled(g)).collect();
    let n = job.gpus as usize;
    if n == 0 || accepted.len() < n || accepted.len() - outside.len() >= n {
        return None;
    }
    let mut outside = outside;
    outside.sort_by_key(|g| g.index);
    let named: Vec<String> = outside
        .iter()
        .map(|g| {
            if g.outside_used > 0 {
                format!("GPU {} ({})", g.index, crate::units::format_bytes(g.outside_used))
            } else {
                format!("GPU {}", g.index)
            }
        })
        .collect();
    let verb = if outside.len() == 1 { "is" } else { "are" };
    Some(format!(
        "can't reserve {n} GPUs: {} {verb} used outside this engine; waiting without holding GPUs",
        named.join(", ")
    ))
}

/// "waits for job 12, which ran 53s past its declared 1s runtime (...)": for each running job on
/// `gpus` that broke its runtime promise. One that is not preemptible is not stopped (an estimate is
/// not a limit: `timeout` is), only demoted: its end is unknown, so no job is backfilled on its
/// promise any more, and its owner's next declarations give way to the learned estimate.
fn overrunning(state: &State, gpus: &[u32]) -> Vec<String> {
    let preemption = state.config.preemption.is_some();
    state
        .running
        .iter()
        .filter(|r| r.gpus.iter().any(|g| gpus.contains(g)))
        .filter_map(|r| {
            let past = overran_ms(r, state.now_ms, state.config.overrun_margin_ms)?;
            let what = if r.victim.is_some() && preemption {
                "preemptible: it is preempted for this job once that lets it start"
            } else {
                "not preemptible, so it runs to its end; no job is backfilled on its promise any more"
            };
            Some(format!(
                "waits for {} ({what})",
                overran_note(r, past).replacen(" ran ", ", which ran ", 1)
            ))
        })
        .collect()
}

struct Ctx<'a> {
    now: i64,
    use_runtimes: bool,
    packing: Packing,
    topology: Topology,
    shapes: &'a [Shape],
    /// [`Config::preemptible`].
    preemptible: &'a [i64],
    /// [`Config::cautious_runtimes`].
    cautious: &'a [(i64, i64)],
    /// [`Config::unproven_runtimes`].
    unproven: &'a [i64],
    /// The lab's `min_run` (built-in where preemption is off): a preemptible job goes on a booked
    /// GPU only if it can run this long before the booking starts.
    min_run: i64,
}
#[cfg(test)]
mod tests;
