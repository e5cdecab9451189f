//! `[slurm]` in the lab config: which backend runs jobs, and how Gantry talks to Slurm.

use std::path::PathBuf;
use std::time::Duration;

/// Which backend runs the jobs (`backend` in the lab config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// Gantry schedules this machine's GPUs and runs containers with Docker.
    #[default]
    Docker,
    /// Slurm schedules; Gantry submits, tracks and records.
    Slurm,
}

/// How the batch script runs the job's image on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Runtime {
    /// `docker run` with the GPUs Slurm allocated (the user needs Docker access on the nodes).
    #[default]
    Docker,
    /// `apptainer exec --nv docker://IMAGE` (rootless; no Docker needed on the nodes).
    Apptainer,
}

/// `[slurm]` in the lab config.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub partition: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    /// How often `squeue` is read.
    pub poll: Duration,
    /// Shared storage Slurm writes job output to (`<log_dir>/<uid>/…`) and the engine reads it from.
    /// `None`: output stays in the user's home on the node, and the job's log says where.
    pub log_dir: Option<PathBuf>,
    pub runtime: Runtime,
    /// The GPU memory one Slurm `shard` stands for; `None`: `gpu_memory` jobs are refused.
    pub shard_memory: Option<u64>,
    /// The nice value of the lowest priority a user may set (the highest gets 0).
    pub max_nice: u32,
    /// The `jobcomp/filetxt` log (final states of jobs that left `squeue`); `None`: asked of `scontrol show config`.
    pub jobcomp_log: Option<PathBuf>,
    /// Where the nodes' agents (`gantry daemon --node-agent DIR`) write their GPU samples.
    pub node_samples: Option<PathBuf>,
}

pub const DEFAULT_POLL: Duration = Duration::from_secs(5);
pub const DEFAULT_MAX_NICE: u32 = 2000;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            partition: None,
            account: None,
            qos: None,
            poll: DEFAULT_POLL,
            log_dir: None,
            runtime: Runtime::Docker,
            shard_memory: None,
            max_nice: DEFAULT_MAX_NICE,
            jobcomp_log: None,
            node_samples: None,
        }
    }
}
