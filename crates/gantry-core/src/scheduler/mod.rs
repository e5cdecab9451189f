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
mod eta;
mod explain;
mod fit;
mod keep;
mod order;
mod pending;
mod preempt;
mod reserve;
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
            Ok(_) if pool.lacks(job, false).is_some() => {
                reserved_for = Some((job.job_id, vec![], pool.lacks(job, true).unwrap_or_default()))
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
            match pool.lacks(job, explained) {
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
        preempt::decide(
            state,
            rules,
            &mut slots,
            &pool,
            &ctx,
            starving.map(|s| s.job_id),
            &mut out,
        );
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
mod tests {
    use super::*;
    const G: u64 = 1 << 30;

    fn gpus(n: u32, mem: u64) -> Vec<GpuView> {
        (0..n)
            .map(|i| GpuView {
                index: i,
                memory_total: mem,
                ..Default::default()
            })
            .collect()
    }
    fn q(id: i64, gpus: u32, mem: Option<u64>) -> QueuedJob {
        QueuedJob {
            job_id: id,
            user: "ada".into(),
            priority: 0,
            submitted_at_ms: id,
            gpus,
            gpu_memory: mem,
            not_before_ms: None,
            expected_runtime_ms: None,
            user_usage: 0.0,
            filter: GpuFilter::default(),
            needs: CpuRam::default(),
            preempted_at_ms: None,
        }
    }
    fn run(id: i64, gpus: &[u32], mem: Option<u64>) -> RunningJob {
        RunningJob {
            job_id: id,
            user: "ada".into(),
            gpus: gpus.to_vec(),
            gpu_memory: mem,
            expected_end_ms: None,
            needs: CpuRam::default(),
            victim: None,
            declared: None,
        }
    }
    fn st(g: Vec<GpuView>, running: Vec<RunningJob>, queued: Vec<QueuedJob>) -> State {
        State {
            now_ms: 1000,
            gpus: g,
            running,
            queued,
            config: Config {
                reserve_after_ms: 10_000,
                ..Config::default()
            },
            typical_wait_ms: None,
            host: None,
        }
    }
    fn capped(cap: u32, mut s: State) -> State {
        s.config.max_running_gpus_per_user = Some(cap);
        s
    }
    /// The lab's per-GPU share is 2 CPUs and 8 GiB.
    fn shared(mut s: State) -> State {
        s.config.gpu_share = Some(CpuRam {
            cpus_milli: 2000,
            memory: 8 * G,
        });
        s
    }
    fn bob(j: QueuedJob) -> QueuedJob {
        QueuedJob {
            user: "bob".into(),
            ..j
        }
    }
    /// CPU and RAM: `host` for the machine, `needs` for a job (CPUs, GiB).
    fn host(cpus: u64, gib: u64, mut s: State) -> State {
        s.host = Some(CpuRam {
            cpus_milli: cpus * 1000,
            memory: gib * G,
        });
        s
    }
    fn needs(cpus: u64, gib: u64, j: QueuedJob) -> QueuedJob {
        QueuedJob {
            needs: CpuRam {
                cpus_milli: cpus * 1000,
                memory: gib * G,
            },
            ..j
        }
    }
    fn holds(cpus: u64, gib: u64, r: RunningJob) -> RunningJob {
        RunningJob {
            needs: CpuRam {
                cpus_milli: cpus * 1000,
                memory: gib * G,
            },
            ..r
        }
    }
    #[test]
    fn gpu_worth_is_gpus_or_cpu_ram_in_per_gpu_shares() {
        let share = Some(CpuRam {
            cpus_milli: 2000,
            memory: 8 * G,
        });
        let c = |cpus: u64, gib: u64| CpuRam {
            cpus_milli: cpus,
            memory: gib * G,
        };
        for (gpus, needs, worth) in [
            (1, c(2000, 8), 1.0),
            (1, c(8000, 1), 4.0),
            (0, c(2000, 1), 1.0),
            (0, c(1000, 1), 0.5),
            (2, c(0, 0), 2.0),
            (1, c(1000, 32), 4.0),
        ] {
            assert_eq!(gpu_worth(gpus, needs, share), worth, "{gpus} {needs:?}");
        }
        assert_eq!(gpu_worth(1, c(8000, 64), None), 1.0, "no share known: GPUs alone");
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
        QueuedJob {
            filter: GpuFilter {
                gpu_type: gpu_type.map(Into::into),
                min_memory: min,
            },
            ..j
        }
    }
    /// GPUs with these links; every other pair crosses the CPU sockets.
    fn linked(mut g: Vec<GpuView>, pairs: &[(u32, u32, crate::gpu::Link)]) -> Vec<GpuView> {
        let n = g.len() as u32;
        for a in 0..n {
            for b in (0..n).filter(|b| *b != a) {
                let link = pairs
                    .iter()
                    .find(|p| (p.0, p.1) == (a, b) || (p.1, p.0) == (a, b))
                    .map_or(crate::gpu::Link::System, |p| p.2);
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
            Case {
                name: "two 1-GPU jobs on two GPUs, third waits",
                state: st(
                    gpus(2, 24 * G),
                    vec![],
                    vec![q(1, 1, None), q(2, 1, None), q(3, 1, None)],
                ),
                want: vec![(1, vec![0]), (2, vec![1])],
            },
            Case {
                name: "big job does not block a later small job",
                state: st(
                    gpus(2, 24 * G),
                    vec![run(9, &[0], None)],
                    vec![q(1, 2, None), q(2, 1, None)],
                ),
                want: vec![(2, vec![1])],
            },
            Case {
                name: "exclusive GPU is never shared",
                state: st(gpus(1, 24 * G), vec![run(9, &[0], None)], vec![q(1, 1, Some(G))]),
                want: vec![],
            },
            Case {
                name: "shared jobs pack when memory fits",
                state: st(
                    gpus(1, 24 * G),
                    vec![],
                    vec![q(1, 1, Some(10 * G)), q(2, 1, Some(10 * G)), q(3, 1, Some(10 * G))],
                ),
                want: vec![(1, vec![0]), (2, vec![0])],
            },
            Case {
                name: "whole-GPU job does not land on a shared GPU",
                state: st(gpus(2, 24 * G), vec![run(9, &[0], Some(G))], vec![q(1, 1, None)]),
                want: vec![(1, vec![1])],
            },
            Case {
                name: "best fit packs onto the fuller GPU",
                state: st(
                    gpus(2, 24 * G),
                    vec![run(9, &[1], Some(16 * G))],
                    vec![q(1, 1, Some(4 * G))],
                ),
                want: vec![(1, vec![1])],
            },
            Case {
                name: "external process makes a GPU busy",
                state: st(
                    {
                        let mut g = gpus(2, 24 * G);
                        g[0].external_busy = true;
                        g
                    },
                    vec![],
                    vec![q(1, 1, None), q(2, 1, Some(G))],
                ),
                want: vec![(1, vec![1])],
            },
            Case {
                name: "priority beats submission order",
                state: st(
                    gpus(1, 24 * G),
                    vec![],
                    vec![
                        q(1, 1, None),
                        QueuedJob {
                            priority: 5,
                            ..q(2, 1, None)
                        },
                    ],
                ),
                want: vec![(2, vec![0])],
            },
            Case {
                name: "cpu-only job always starts",
                state: st(gpus(1, 24 * G), vec![run(9, &[0], None)], vec![q(1, 0, None)]),
                want: vec![(1, vec![])],
            },
            Case {
                name: "retry backoff holds a job",
                state: st(
                    gpus(1, 24 * G),
                    vec![],
                    vec![
                        QueuedJob {
                            not_before_ms: Some(5000),
                            ..q(1, 1, None)
                        },
                        q(2, 1, None),
                    ],
                ),
                want: vec![(2, vec![0])],
            },
            Case {
                name: "user cap: ada runs 1 GPU, cap 2: one more starts, bob's job fills the rest",
                state: capped(
                    2,
                    st(
                        gpus(4, 24 * G),
                        vec![run(9, &[0], None)],
                        vec![q(1, 1, None), q(2, 1, None), bob(q(3, 1, None))],
                    ),
                ),
                want: vec![(1, vec![1]), (3, vec![2])],
            },
            Case {
                name: "user cap counts GPUs, not jobs",
                state: capped(
                    2,
                    st(
                        gpus(4, 24 * G),
                        vec![],
                        vec![q(1, 2, None), q(2, 1, Some(G)), bob(q(3, 2, None))],
                    ),
                ),
                want: vec![(1, vec![0, 1]), (3, vec![2, 3])],
            },
            Case {
                name: "user cap: a job larger than the cap never starts; CPU jobs are not capped",
                state: capped(1, st(gpus(4, 24 * G), vec![], vec![q(1, 2, None), q(2, 0, None)])),
                want: vec![(2, vec![])],
            },
            // Issue 18 item 10: with the lab's per-GPU share (2 CPUs, 8 GiB) known, CPU and RAM count
            // in the cap as the GPUs' shares they hold: a CPU-only job too.
            Case {
                name: "user cap counts CPU-only jobs by their share: ada's 2-CPU job is 1 GPU's worth",
                state: shared(capped(
                    1,
                    st(
                        gpus(4, 24 * G),
                        vec![holds(2, 1, run(9, &[], None))],
                        vec![q(1, 1, None), bob(q(2, 1, None))],
                    ),
                )),
                want: vec![(2, vec![0])],
            },
            Case {
                name: "user cap counts a 1-GPU job holding 4 GPUs' CPUs as 4 GPUs",
                state: shared(capped(
                    2,
                    st(
                        gpus(4, 24 * G),
                        vec![],
                        vec![needs(8, 1, q(1, 1, None)), bob(needs(2, 8, q(2, 1, None)))],
                    ),
                )),
                want: vec![(2, vec![0])],
            },
            Case {
                name: "user cap: jobs within their GPUs' share count as their GPUs",
                state: shared(capped(
                    2,
                    st(
                        gpus(4, 24 * G),
                        vec![holds(2, 8, run(9, &[0], None))],
                        vec![needs(2, 8, q(1, 1, None)), needs(2, 8, q(2, 1, None))],
                    ),
                )),
                want: vec![(1, vec![1])],
            },
            Case {
                name: "no cap: one user may take every GPU",
                state: st(gpus(2, 24 * G), vec![run(9, &[0], None)], vec![q(1, 1, None)]),
                want: vec![(1, vec![1])],
            },
            Case {
                name: "memory used outside Gantry adds to declared memory",
                state: st(
                    {
                        let mut g = gpus(1, 24 * G);
                        g[0].memory_used = 13 * G;
                        g[0].outside_used = 12 * G;
                        g
                    },
                    vec![run(9, &[0], Some(4 * G))],
                    vec![q(1, 1, Some(10 * G))],
                ),
                want: vec![],
            },
            Case {
                name: "gpu_type takes only GPUs whose name matches, any case",
                state: st(
                    mixed(),
                    vec![],
                    vec![
                        want(q(1, 1, None), Some("h100"), None),
                        want(q(2, 2, None), Some("A100"), None),
                    ],
                ),
                want: vec![(1, vec![2]), (2, vec![0, 1])],
            },
            Case {
                name: "min_gpu_memory skips smaller GPUs",
                state: st(mixed(), vec![], vec![want(q(1, 1, None), None, Some(60 * G))]),
                want: vec![(1, vec![2])],
            },
            Case {
                name: "filter and memory together; busy matches make it wait, later jobs still start",
                state: st(
                    mixed(),
                    vec![run(9, &[2, 3], None)],
                    vec![want(q(1, 1, None), Some("H100"), Some(40 * G)), q(2, 1, None)],
                ),
                want: vec![(2, vec![0])],
            },
            Case {
                name: "a filtered shared job packs only onto matching GPUs",
                state: st(
                    mixed(),
                    vec![run(9, &[0], Some(10 * G))],
                    vec![want(q(1, 1, Some(10 * G)), Some("H100"), None)],
                ),
                want: vec![(1, vec![2])],
            },
            Case {
                name: "no topology: lowest indexes",
                state: st(gpus(4, 24 * G), vec![], vec![q(1, 2, None)]),
                want: vec![(1, vec![0, 1])],
            },
            Case {
                name: "topology: the NVLink pair among equal free GPUs",
                state: st(
                    linked(
                        gpus(4, 24 * G),
                        &[
                            (0, 2, crate::gpu::Link::Nvlink),
                            (1, 3, crate::gpu::Link::Nvlink),
                            (0, 1, crate::gpu::Link::PcieSwitch),
                        ],
                    ),
                    vec![],
                    vec![q(1, 2, None)],
                ),
                want: vec![(1, vec![0, 2])],
            },
            Case {
                name: "topology: same PCIe switch beats host bridge",
                state: st(
                    linked(
                        gpus(4, 24 * G),
                        &[
                            (1, 2, crate::gpu::Link::PcieSwitch),
                            (0, 1, crate::gpu::Link::HostBridge),
                            (2, 3, crate::gpu::Link::HostBridge),
                        ],
                    ),
                    vec![run(9, &[0], None)],
                    vec![q(1, 2, None)],
                ),
                want: vec![(1, vec![1, 2])],
            },
            Case {
                name: "topology: a quad of NVLink pairs",
                state: st(
                    linked(
                        gpus(8, 24 * G),
                        &[
                            (0, 4, crate::gpu::Link::Nvlink),
                            (0, 5, crate::gpu::Link::Nvlink),
                            (4, 5, crate::gpu::Link::Nvlink),
                            (1, 4, crate::gpu::Link::Nvlink),
                            (0, 1, crate::gpu::Link::Nvlink),
                            (1, 5, crate::gpu::Link::Nvlink),
                        ],
                    ),
                    vec![],
                    vec![q(1, 4, None)],
                ),
                want: vec![(1, vec![0, 1, 4, 5])],
            },
            Case {
                name: "topology never overrides best fit: the fuller GPU stays, its NVLink peer joins",
                state: st(
                    linked(
                        gpus(4, 24 * G),
                        &[(1, 3, crate::gpu::Link::Nvlink), (0, 2, crate::gpu::Link::Nvlink)],
                    ),
                    vec![run(9, &[1], Some(8 * G))],
                    vec![q(1, 2, Some(4 * G))],
                ),
                want: vec![(1, vec![1, 3])],
            },
            Case {
                name: "CPU: a job needing more CPUs than are free waits; a smaller later one starts",
                state: host(
                    16,
                    256,
                    st(
                        gpus(4, 24 * G),
                        vec![holds(10, 8, run(9, &[0], None))],
                        vec![needs(8, 8, q(1, 1, None)), needs(6, 8, q(2, 1, None))],
                    ),
                ),
                want: vec![(2, vec![1])],
            },
            Case {
                name: "RAM: a job needing more memory than is free waits",
                state: host(
                    64,
                    100,
                    st(
                        gpus(2, 24 * G),
                        vec![holds(1, 60, run(9, &[0], None))],
                        vec![needs(1, 50, q(1, 1, None)), needs(1, 40, q(2, 0, None))],
                    ),
                ),
                want: vec![(2, vec![])],
            },
            Case {
                name: "CPU-only jobs are counted too and no longer always start",
                state: host(
                    4,
                    64,
                    st(
                        gpus(1, 24 * G),
                        vec![],
                        vec![
                            needs(3, 1, q(1, 0, None)),
                            needs(3, 1, q(2, 0, None)),
                            needs(1, 1, q(3, 1, None)),
                        ],
                    ),
                ),
                want: vec![(1, vec![]), (3, vec![0])],
            },
            Case {
                name: "CPU: jobs placed in the same pass count against each other",
                state: host(
                    8,
                    64,
                    st(
                        gpus(4, 24 * G),
                        vec![],
                        vec![
                            needs(4, 1, q(1, 1, None)),
                            needs(4, 1, q(2, 1, None)),
                            needs(4, 1, q(3, 1, None)),
                        ],
                    ),
                ),
                want: vec![(1, vec![0]), (2, vec![1])],
            },
            Case {
                name: "no host capacity (a trace): CPU and RAM are not counted",
                state: st(
                    gpus(2, 24 * G),
                    vec![holds(100, 100, run(9, &[0], None))],
                    vec![needs(100, 100, q(1, 1, None))],
                ),
                want: vec![(1, vec![1])],
            },
            Case {
                name: "CPU fits but no GPU: the job waits for the GPU, and no CPU is taken",
                state: host(
                    8,
                    64,
                    st(
                        gpus(1, 24 * G),
                        vec![holds(1, 1, run(9, &[0], None))],
                        vec![needs(4, 1, q(1, 1, None)), needs(4, 1, q(2, 0, None))],
                    ),
                ),
                want: vec![(2, vec![])],
            },
            Case {
                name: "measured memory above declared limits sharing",
                state: st(
                    {
                        let mut g = gpus(1, 24 * G);
                        g[0].memory_used = 20 * G;
                        g
                    },
                    vec![run(9, &[0], Some(4 * G))],
                    vec![q(1, 1, Some(8 * G))],
                ),
                want: vec![],
            },
        ];
        for c in cases {
            assert_eq!(placed(&plan(&c.state)), c.want, "{}", c.name);
        }
    }

    #[test]
    fn starving_big_job_gets_a_reservation() {
        // 2 GPUs, GPU 0 busy. A 2-GPU job waited past the limit: GPU 1 must not go to the small job.
        let mut s = st(
            gpus(2, 24 * G),
            vec![run(9, &[0], None)],
            vec![q(1, 2, None), q(2, 1, None)],
        );
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

    /// Issue 18 item 7: a reservation rests on running jobs' ends; one past its declared runtime (and
    /// the margin) has none any more, so the reservation goes where the GPUs will really free.
    #[test]
    fn a_broken_runtime_promise_moves_the_reservation() {
        let h = 3_600_000;
        let liar = RunningJob {
            expected_end_ms: Some(2 * h - 54_000 + 1000),
            declared: Some(Declared {
                started_ms: 2 * h - 54_000,
                runtime_ms: 1000,
            }),
            ..run(9, &[0], None)
        };
        let honest = RunningJob {
            expected_end_ms: Some(3 * h),
            ..run(8, &[1], None)
        };
        let mut s = st(
            gpus(2, 24 * G),
            vec![liar, honest],
            vec![QueuedJob {
                submitted_at_ms: 0,
                ..q(1, 1, None)
            }],
        );
        s.now_ms = 2 * h;
        let p = plan(&s);
        assert_eq!(
            p.waiting[0].reserved,
            vec![1],
            "the GPU that frees in an hour, not the one whose job broke its promise: {p:?}"
        );
        // Trusted (main's behaviour: a margin never reached), the liar's GPU looked free now.
        s.config.overrun_margin_ms = i64::MAX / 4;
        assert_eq!(plan(&s).waiting[0].reserved, vec![0]);
        // The margin: max(30 s, a tenth of the declaration).
        assert_eq!(
            (overrun_margin_ms(1000, 30_000), overrun_margin_ms(10 * h, 30_000)),
            (30_000, h)
        );
    }

    /// Issue 18 item 7: a 4-GPU job that can never start (one GPU held outside Gantry) kept 3 GPUs
    /// reserved and idle while alice's 1-GPU jobs waited.
    #[test]
    fn a_job_blocked_by_outside_use_holds_no_gpus() {
        let mut g = gpus(4, 32 * G);
        g[2].external_busy = true;
        g[2].outside_used = 30 * G;
        g[2].outside_since_ms = Some(0); // for 100 s: settled
        let alice = |j: QueuedJob| QueuedJob {
            user: "alice".into(),
            submitted_at_ms: 50_000,
            ..j
        };
        let queue = vec![
            QueuedJob {
                submitted_at_ms: 0,
                ..q(1, 4, None)
            },
            alice(q(2, 1, None)),
            alice(q(3, 1, None)),
            alice(q(4, 1, None)),
        ];
        let mut s = st(g, vec![], queue);
        s.now_ms = 100_000; // job 1 waited past reserve_after
        let p = plan(&s);
        assert_eq!(placed(&p), vec![(2, vec![0]), (3, vec![1]), (4, vec![3])]);
        let w = &p.waiting[0];
        assert_eq!(w.job_id, 1);
        assert!(w.reserved.is_empty());
        assert!(
            w.reason.ends_with(
                "; can't reserve 4 GPUs: GPU 2 (30.0 GiB) is used outside this engine; waiting without holding GPUs"
            ),
            "{}",
            w.reason
        );
        // GPUs preempted for it before the outside use began are not kept for it either.
        s.config.claims = vec![(1, vec![0, 1, 2, 3])];
        assert_eq!(
            placed(&plan(&s)),
            vec![(2, vec![0]), (3, vec![1]), (4, vec![3])],
            "a claim it cannot use idled 3 GPUs"
        );
        // Once the outside use ends, the claim holds again and it starts.
        s.gpus[2].external_busy = false;
        s.gpus[2].outside_used = 0;
        s.gpus[2].outside_since_ms = None;
        assert_eq!(placed(&plan(&s)), vec![(1, vec![0, 1, 2, 3])]);
        // And it does not take the one reservation from a job that can use it: a 2-GPU job overdue
        // behind it reserves GPUs 1 and 3 (3 free, 1 freeing in 50 s); the small job does not take 3.
        let mut g = gpus(4, 32 * G);
        g[2].external_busy = true;
        g[2].outside_since_ms = Some(0);
        let running = vec![
            run(9, &[0], None),
            RunningJob {
                expected_end_ms: Some(150_000),
                ..run(8, &[1], None)
            },
        ];
        let mut s = st(
            g,
            running,
            vec![
                QueuedJob {
                    submitted_at_ms: 0,
                    ..q(1, 4, None)
                },
                QueuedJob {
                    submitted_at_ms: 10,
                    ..q(5, 2, None)
                },
                alice(q(6, 1, None)),
            ],
        );
        s.now_ms = 100_000;
        let p = plan(&s);
        assert_eq!(placed(&p), vec![]);
        assert_eq!(
            p.waiting.iter().find(|w| w.job_id == 5).unwrap().reserved,
            vec![1, 3],
            "{p:?}"
        );
    }

    /// Found by the engine test: the GPU of a job that just ended is still listed as used (outside
    /// this engine) by the last sample; a reservation counting on it must not lapse for that pass,
    /// or a backfill slips in on the GPU it reserved.
    #[test]
    fn a_stale_sample_does_not_break_a_reservation_but_lasting_outside_use_does() {
        let mut g = gpus(2, 24 * G);
        g[0].external_busy = true;
        g[0].outside_since_ms = Some(99_000); // 1 s ago
        let mut s = st(
            g,
            vec![],
            vec![
                QueuedJob {
                    submitted_at_ms: 0,
                    ..q(1, 2, None)
                },
                QueuedJob {
                    submitted_at_ms: 90_000,
                    ..q(2, 1, None)
                },
            ],
        );
        s.now_ms = 100_000;
        let p = plan(&s);
        assert_eq!(
            (placed(&p), p.waiting[0].reserved.clone()),
            (vec![], vec![0, 1]),
            "{p:?}"
        );
        s.gpus[0].outside_since_ms = Some(0); // 100 s: someone's work
        let p = plan(&s);
        assert_eq!(
            (placed(&p), p.waiting[0].reserved.clone()),
            (vec![(2, vec![1])], vec![]),
            "{p:?}"
        );
    }

    #[test]
    fn reasons_explain_the_wait() {
        let p = plan(&st(
            gpus(2, 24 * G),
            vec![run(7, &[0], None), run(8, &[1], None)],
            vec![q(1, 1, None), q(2, 3, None)],
        ));
        assert_eq!(p.waiting[0].position, 1);
        assert!(
            p.waiting[0].reason.contains("needs 1 free GPU, 0 available"),
            "{}",
            p.waiting[0].reason
        );
        assert!(
            p.waiting[0].reason.contains("GPU 0 held by job 7; GPU 1 held by job 8"),
            "{}",
            p.waiting[0].reason
        );
        assert!(
            p.waiting[1].reason.contains("this machine has 2"),
            "{}",
            p.waiting[1].reason
        );
    }

    #[test]
    fn a_filtered_job_says_what_it_waits_for() {
        let p = plan(&st(
            mixed(),
            vec![run(7, &[2], None), run(8, &[3], None)],
            vec![
                want(q(1, 1, None), Some("H100"), Some(40 * G)),
                want(q(2, 3, None), Some("H100"), None),
            ],
        ));
        assert_eq!(p.waiting[0].reason, "waits for an H100 with ≥ 40.0 GiB: GPUs 2,3 match; needs 1 free GPU, 0 available (GPU 2 held by job 7; GPU 3 held by job 8)");
        assert_eq!(p.waiting[1].reason, "waits for 3 H100s: this machine has 2 such GPUs");
        // A starving filtered job reserves only GPUs it accepts.
        let mut s = st(
            mixed(),
            vec![run(7, &[0, 2], None)],
            vec![want(q(1, 2, None), Some("H100"), None), q(2, 1, None)],
        );
        s.now_ms = 60_000;
        let p = plan(&s);
        assert_eq!(p.waiting[0].reserved, vec![2, 3], "{p:?}");
        assert_eq!(placed(&p), vec![(2, vec![1])]);
    }

    #[test]
    fn the_topology_note_names_the_link() {
        use crate::gpu::Link;
        let g = linked(
            gpus(4, 24 * G),
            &[(0, 1, Link::Nvlink), (0, 2, Link::PcieSwitch), (1, 2, Link::PcieSwitch)],
        );
        assert_eq!(topology_note(&g, &[0, 1]).as_deref(), Some("GPUs 0,1: NVLink"));
        assert_eq!(
            topology_note(&g, &[0, 1, 2]).as_deref(),
            Some("GPUs 0,1,2: same PCIe switch or closer")
        );
        assert_eq!(topology_note(&g, &[0]), None);
        assert_eq!(
            topology_note(&gpus(2, G), &[0, 1]),
            None,
            "simulated GPUs: no topology, no note"
        );
        assert_eq!(
            GpuFilter {
                gpu_type: Some("A100".into()),
                min_memory: None
            }
            .describe(1),
            "an A100"
        );
        assert_eq!(
            GpuFilter {
                gpu_type: Some("Tesla".into()),
                min_memory: None
            }
            .describe(1),
            "a Tesla"
        );
        assert_eq!(
            GpuFilter {
                gpu_type: None,
                min_memory: Some(60 * G)
            }
            .describe(2),
            "2 GPUs with ≥ 60.0 GiB"
        );
    }

    #[test]
    fn cpu_and_ram_reasons_name_what_is_free_and_who_holds_it() {
        let alice = |r: RunningJob| RunningJob {
            user: "alice".into(),
            ..r
        };
        let running = vec![
            alice(holds(10, 20, run(12, &[0], None))),
            holds(2, 40, run(13, &[1], None)),
        ];
        let s = host(
            18,
            64,
            st(
                gpus(4, 24 * G),
                running,
                vec![
                    needs(16, 1, q(1, 1, None)),
                    needs(1, 2, q(2, 0, None)),
                    needs(20, 1, q(3, 0, None)),
                    QueuedJob {
                        needs: CpuRam {
                            cpus_milli: 500,
                            memory: 100 * G,
                        },
                        ..q(4, 0, None)
                    },
                ],
            ),
        );
        let p = plan(&s);
        let w = |id| {
            p.waiting
                .iter()
                .find(|w| w.job_id == id)
                .map(|w| w.reason.clone())
                .unwrap_or_default()
        };
        assert_eq!(
            w(1),
            "needs 16 CPUs, 6 free (alice's job 12 uses 10; ada's job 13 uses 2)"
        );
        assert_eq!(
            placed(&p),
            vec![(2, vec![])],
            "the small CPU-only job starts beside them"
        );
        assert_eq!(w(3), "needs 20 CPUs, this machine has 18 for jobs");
        assert_eq!(w(4), "needs 100.0 GiB of memory, this machine has 64.0 GiB for jobs");
        let s = host(
            18,
            64,
            st(
                gpus(2, 24 * G),
                vec![alice(holds(1, 40, run(12, &[0], None)))],
                vec![needs(1, 30, q(1, 1, None))],
            ),
        );
        assert_eq!(
            plan(&s).waiting[0].reason,
            "needs 30.0 GiB of memory, 24.0 GiB free (alice's job 12 uses 40.0 GiB)"
        );
        assert_eq!(
            (format_cpus(500), format_cpus(333), format_cpus(16_000)),
            ("0.5".into(), "0.33".into(), "16".into())
        );
    }

    #[test]
    fn a_starving_job_short_of_cpu_waits_without_draining_gpus() {
        let mut s = host(
            8,
            64,
            st(
                gpus(2, 24 * G),
                vec![holds(6, 1, run(9, &[0], None))],
                vec![needs(4, 1, q(1, 1, None)), needs(2, 1, q(2, 1, None))],
            ),
        );
        s.now_ms = 60_000;
        let p = plan(&s);
        assert_eq!(placed(&p), vec![(2, vec![1])], "{p:?}");
        assert_eq!(p.waiting[0].reason, "needs 4 CPUs, 2 free (ada's job 9 uses 6)");
        assert!(p.waiting[0].reserved.is_empty());
    }

    #[test]
    fn a_capped_user_waits_with_the_reason_and_never_reserves() {
        let mut s = capped(
            1,
            st(
                gpus(2, 24 * G),
                vec![run(9, &[0], None)],
                vec![q(1, 1, None), bob(q(2, 2, None))],
            ),
        );
        s.now_ms = 60_000; // both waited past the reservation threshold
        let p = plan(&s);
        assert!(p.placements.is_empty(), "{p:?}");
        let w = |id| p.waiting.iter().find(|w| w.job_id == id).unwrap();
        assert_eq!(w(1).reason, "ada already runs 1 GPU; the lab limit is 1 per user");
        assert!(
            w(1).reserved.is_empty(),
            "a job its own cap holds back must not drain GPUs"
        );
        assert_eq!(w(2).reason, "asks for 2 GPUs; the lab limit is 1 GPU per user");
    }

    #[test]
    fn deterministic_regardless_of_input_order() {
        let a = st(
            gpus(4, 24 * G),
            vec![],
            (1..=8)
                .map(|i| q(i, (i % 3) as u32, if i % 2 == 0 { Some(6 * G) } else { None }))
                .collect(),
        );
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
                .map(|i| {
                    q(
                        i,
                        rnd(n as u64 + 1) as u32,
                        if rnd(2) == 0 { Some((1 + rnd(24)) * G) } else { None },
                    )
                })
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
