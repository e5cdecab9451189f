//! Trace replay: runs a workload through the same `scheduler::plan` the engine uses, on a virtual
//! clock (no Docker, no sleeping), and reports makespan, utilization, waits and per-user shares.
//!
//! Trace formats (detected from the header):
//! - Gantry CSV: `submit_s,duration_s,gpus,gpu_memory,user,priority` (`gpu_memory` empty = whole GPUs,
//!   else a size like `8GiB`; `user` and `priority` optional).
//! - Alibaba GPU-cluster CSV (`num_gpu`, `gpu_milli`, `creation_time`, `deletion_time`): duration =
//!   deletion − creation; `gpu_milli` < 1000 on a 1-GPU task is a share of one GPU.
//!
//! Here: the run's settings ([`SimConfig`], [`Policy`], lying users, preemption), the random stream;
//! `trace` reads and reshapes traces, `run` replays one ([`simulate`]), `fgd` runs FGD's packing
//! protocol, `report` measures a run into its [`Report`].

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::estimate::{Estimate, History, JobKey};
use crate::scheduler::{self, GpuView, QueuedJob, RunningJob};

mod fgd;
mod report;
mod run;
#[cfg(test)]
mod tests;
mod trace;

pub use fgd::{simulate_fgd, FgdReport};
pub use report::{mean_ci, Mechanisms, Report};
pub use run::simulate;
pub use trace::{load_trace, parse_trace, perturb_arrivals, rescale_load, Trace, TraceJob};

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot read the trace: {0}")]
    Io(#[from] std::io::Error),
    #[error("trace line {line}: {msg}")]
    Parse { line: usize, msg: String },
    #[error("unknown trace format: expected a header with `submit_s,duration_s,gpus,...` or Alibaba's `num_gpu,gpu_milli,creation_time,deletion_time`")]
    UnknownFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// One job at a time.
    Serial,
    /// Strict priority/submission order: the head of the queue blocks everyone behind it.
    Fifo,
    /// First fit over the whole queue, no reservations.
    Greedy,
    /// Gantry's scheduler as the engine runs it.
    Gantry,
}

impl Policy {
    pub const ALL: [Policy; 4] = [Policy::Serial, Policy::Fifo, Policy::Greedy, Policy::Gantry];
    pub fn parse(s: &str) -> Option<Policy> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }
    pub fn name(self) -> &'static str {
        match self {
            Policy::Serial => "serial",
            Policy::Fifo => "fifo",
            Policy::Greedy => "greedy",
            Policy::Gantry => "gantry",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SimConfig {
    pub gpus: u32,
    pub gpu_memory: u64,
    pub policy: Policy,
    /// Pass trace durations to the scheduler as declared `expected_runtime`.
    pub declared_runtimes: bool,
    pub scheduler: scheduler::Config,
    /// Fair share: decay users' GPU-hours with this half-life (seconds); `None` = off.
    #[serde(default)]
    pub fair_share_half_life_s: Option<f64>,
    /// Without declared runtimes, estimate them from the jobs completed so far (what the engine
    /// does from its store). Off: the scheduler knows no runtimes at all.
    #[serde(default)]
    pub learn_runtimes: bool,
    /// Preemption (Gantry's policy only): `None` = off.
    #[serde(default)]
    pub preempt: Option<SimPreempt>,
    /// With declared runtimes, some users lie about them (`gantry sim --lying-users`).
    #[serde(default)]
    pub lying: Option<SimLying>,
}

/// `gantry sim --runtimes --lying-users S`: a share `S` of the users (rounded, at least one; picked by a
/// fixed hash of the name, so every policy and seed agrees) declare
/// `expected_runtime: 1s` whatever their jobs take, to be backfilled (issue 18 item 7); the others
/// declare their jobs' true durations.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SimLying {
    pub share: f64,
    /// Gantry's answer (issue 18 item 7) on: a job past its declaration by the margin is no longer
    /// trusted (and preempted for the reservation it blocks if preemptible), and its owner's next
    /// declarations give way to the learned p80. Off: declarations trusted, as before it.
    pub checked: bool,
}

impl SimLying {
    /// The users who lie among those of `jobs`: the `share` of them (rounded, at least one) whose
    /// names hash lowest.
    pub fn liars(&self, jobs: &[TraceJob]) -> std::collections::BTreeSet<String> {
        let hash = |u: &str| {
            Rng::new(u.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
            }))
            .next_u64()
        };
        let mut users: Vec<&str> = jobs
            .iter()
            .map(|j| j.user.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        users.sort_by_key(|u| (hash(u), u.to_string()));
        let n = ((users.len() as f64 * self.share).round() as usize)
            .max(usize::from(self.share > 0.0))
            .min(users.len());
        users[..n].iter().map(|u| u.to_string()).collect()
    }
}

/// What a liar declares.
const LIE_MS: i64 = 1000;

/// How `gantry sim --preempt` models preemption: the lab's rules (the same `plan()` decides), which
/// jobs are preemptible, and what a preemption costs. A preempted job keeps its GPUs for the grace,
/// then goes back to the queue at its place; it loses the work since its last checkpoint (taken every
/// `checkpoint_every_ms` of its attempt, so on average half of that) plus the grace, and pays
/// `restart_cost_ms` when it starts again.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SimPreempt {
    pub rules: scheduler::PreemptRules,
    pub checkpoint_every_ms: i64,
    pub restart_cost_ms: i64,
    pub grace_ms: i64,
    /// The share of jobs that are preemptible (chosen by a fixed hash of the job's index).
    pub preemptible_share: f64,
    /// Jobs report each checkpoint (a `checkpoint` metrics point): the scheduler knows each victim's
    /// last one ([`scheduler::Victim::last_checkpoint_ms`]) and stops those that lose least. Off: it
    /// knows only their starts, as the engine until the metrics are wired to it.
    #[serde(default)]
    pub checkpoints_reported: bool,
}

impl SimPreempt {
    /// Whether job `j` of the trace is preemptible: a fixed hash, so every policy and seed agrees.
    pub fn preemptible(&self, j: usize) -> bool {
        self.preemptible_share >= 1.0
            || Rng::new((j as u64).wrapping_mul(0xA24B_AED4_963E_E407)).unit() < self.preemptible_share
    }
}

const MS: f64 = 1000.0;

/// FGD packing weighs request shapes by their share of the last this-many submissions: enough that
/// a shape with a 10% share is known to ±2.6 points (95%), recent enough to follow a change of mix.
pub const SHAPE_WINDOW: usize = 500;

/// A deterministic random stream (SplitMix64): the same seed gives the same perturbation everywhere.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}
