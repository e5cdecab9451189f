//! GPUs as clients see them: samples, topology, who uses each GPU. Imports nothing of the crate:
//! `crate::gpu` (the NVML and simulated backends) produces these and re-exports them.

use serde::{Deserialize, Serialize};
use ts_rs::TS;

/// Where the GPU figures come from: the NVIDIA driver, or simulated GPUs (always said so).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    Nvml,
    Simulated,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct GpuProcess {
    pub pid: u32,
    pub used_memory: Option<u64>,
    /// Docker container id (64 hex) when the process lives in a container.
    pub container_id: Option<String>,
    /// Owner (uid of /proc/PID), when the process is still there.
    #[serde(default)]
    pub uid: Option<u32>,
    /// Command line (/proc/PID/cmdline, arguments joined by spaces, at most `gpu::COMMAND_MAX` chars).
    #[serde(default)]
    pub command: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct GpuSample {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total: u64,
    pub memory_used: u64,
    pub utilization: u32,
    pub temperature_c: Option<u32>,
    pub power_w: Option<f64>,
    pub processes: Vec<GpuProcess>,
    /// Set when this device is a MIG instance: the physical GPU it is carved from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_parent: Option<MigParent>,
    /// How this GPU connects to each other GPU, when NVML reports a topology.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<GpuLink>,
}

/// The physical GPU a MIG instance belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct MigParent {
    /// The physical GPU's NVML index (as `nvidia-smi` numbers it).
    pub index: u32,
    pub uuid: String,
    pub name: String,
}

/// How two GPUs are connected, closest first: NVLink, then NVML's common-ancestor levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum Link {
    Nvlink,
    SameBoard,
    PcieSwitch,
    PcieSwitches,
    HostBridge,
    NumaNode,
    System,
}

impl Link {
    pub fn describe(self) -> &'static str {
        match self {
            Link::Nvlink => "NVLink",
            Link::SameBoard => "same board",
            Link::PcieSwitch => "same PCIe switch",
            Link::PcieSwitches => "PCIe switches, no host bridge",
            Link::HostBridge => "same host bridge",
            Link::NumaNode => "same NUMA node",
            Link::System => "across CPU sockets",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct GpuLink {
    /// The other GPU's index.
    pub peer: u32,
    pub link: Link,
}

/// `users` and `reserved` come only from the `gpus` command, not from the live samples.
#[derive(Debug, Clone, Serialize, Deserialize, TS)]
pub struct GpuStatus {
    pub backend: BackendKind,
    /// Why NVML is not used, when it is not.
    pub note: Option<String>,
    pub gpus: Vec<GpuSample>,
    /// Which Gantry jobs hold which GPU.
    pub holders: Vec<(u32, Vec<i64>)>,
    /// GPUs the lab config keeps for interactive use: Gantry never places jobs on them.
    #[serde(default)]
    pub reserved: Vec<u32>,
    /// Everything on each GPU: this engine's jobs, and every process or container outside them.
    #[serde(default)]
    pub users: Vec<GpuUser>,
    /// The NVML library loaded instead of the driver's (`GANTRY_NVML_LIB`, e.g. a test double).
    #[serde(default)]
    pub library: Option<String>,
}

/// One user of a GPU. A job of this engine has `job_id` (its processes on the GPU folded into one
/// row); anything else is outside Gantry: a process (`pid`, `user`, `command`, and `container` when it
/// runs in one), or a container that holds the GPU with no process on it yet (`container` only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct GpuUser {
    pub gpu: u32,
    pub job_id: Option<i64>,
    pub job_name: Option<String>,
    /// The job's owner, or the process's user.
    pub user: Option<String>,
    pub pid: Option<u32>,
    pub command: Option<String>,
    /// Container name (or short id) of a process or container outside this engine's jobs.
    pub container: Option<String>,
    /// GPU memory it uses, when NVML reports it.
    pub used_memory: Option<u64>,
    /// When the job started (ms).
    pub since: Option<i64>,
    /// Outside Gantry only: since when (ms) its GPU has read 0 % utilization, once that is a minute
    /// or more ("idle for 2 h 10 min", so an admin can act). The engine's memory of its samples: an
    /// engine restart starts the count again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub idle_since: Option<i64>,
}

/// One second of `GET /v1/gpus/recent`: `[ms, per GPU [util %, memory used bytes]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct RecentSample(pub i64, pub Vec<(u32, u64)>);

/// One minute of `GET /v1/gpus/{index}/minutes`: `[minute (ms), mean util %, mean memory used bytes]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct GpuMinute(pub i64, pub f64, pub i64);
