//! How well runs used what they held (issue 30 item 3): one run's `efficiency` in `gantry show`, and
//! `gantry usage --efficiency` (per user and per day). The engine measures it with no action from
//! the job's owner: the container's cgroup (CPU time, peak RAM) and the 1 Hz GPU samples.

use serde::{Deserialize, Serialize};
use ts_rs::TS;

/// One run's use of what it held, over its attempts (`efficiency` in `GET /v1/jobs/{id}`). A figure
/// is absent when it could not be measured (a run shorter than one sample, the Slurm backend, a
/// CPU-only job's GPU figures).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, TS)]
pub struct Efficiency {
    /// CPU time ÷ (CPUs held × time measured), 0..1.
    #[ts(optional = nullable)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    /// CPUs held (its limit).
    pub cpus_held: f64,
    /// CPUs it used on average (CPU time ÷ time measured).
    #[ts(optional = nullable)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_used: Option<f64>,
    /// The most RAM it held (bytes, its cgroup's peak).
    #[ts(optional = nullable)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ram_peak: Option<u64>,
    /// RAM it was limited to (bytes).
    #[ts(optional = nullable)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ram_held: Option<u64>,
    /// Mean utilization of its GPUs while it ran, 0..1.
    #[ts(optional = nullable)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_util: Option<f64>,
    /// One of its GPUs ran another job at the same time in some samples: `gpu_util` is the GPU's,
    /// not this run's alone.
    #[serde(default)]
    pub gpu_shared: bool,
    /// The most GPU memory its processes held on one GPU (bytes).
    #[ts(optional = nullable)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_peak: Option<u64>,
    /// `gpu_memory_peak` is a simulated GPU's figure: the memory the job declared (or the card's).
    #[serde(default)]
    pub gpu_memory_simulated: bool,
    /// One GPU's memory (bytes), for "it fits on part of a card".
    #[ts(optional = nullable)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_total: Option<u64>,
    /// How long it was measured (ms, all attempts).
    pub measured_ms: i64,
    /// What its owner can do about it, one sentence each (empty: nothing to say).
    pub advice: Vec<String>,
}

/// `?since_ms=` of `GET /v1/usage/efficiency`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct EfficiencyQuery {
    pub since_ms: i64,
    /// The viewer's time zone (minutes east of UTC), so days are theirs.
    #[serde(default)]
    pub tz_offset_min: i32,
}

/// One user's held vs used in `gantry usage --efficiency`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct UserEfficiency {
    pub user: String,
    /// GPU count × run time of attempts, clipped to the window.
    pub gpu_hours_held: f64,
    /// The same, weighted by each attempt's mean GPU utilization.
    pub gpu_hours_used: f64,
    /// Held GPU-hours of attempts without a GPU measure (the Slurm backend, a run under a second).
    pub gpu_hours_unmeasured: f64,
    /// Mean CPU efficiency of their attempts, weighted by CPUs × time (0..1).
    #[ts(optional = nullable)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    pub runs: u64,
}

/// The machine's held vs used GPU-hours in one local day.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct DayEfficiency {
    /// The local day's start (ms since the epoch).
    pub start: i64,
    pub gpu_hours_held: f64,
    pub gpu_hours_used: f64,
}

/// `GET /v1/usage/efficiency`: over [since_ms, until_ms).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct EfficiencyReport {
    pub since_ms: i64,
    pub until_ms: i64,
    pub users: Vec<UserEfficiency>,
    pub days: Vec<DayEfficiency>,
}
