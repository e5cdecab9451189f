//! Gantry core: everything the engine and its clients share, with no GUI dependency.
//!
//! - [`units`] / [`defaults`]: pure leaves: unit parsing/formatting; every tunable with its reason
//! - [`spec`]: the job spec (YAML/TOML), validation and JSON Schema
//! - [`access`]: host paths checked as the submitter (mounts)
//! - [`staging`]: checked mounts pinned for Docker (root engine), and the files the engine generates for a container
//! - [`passwd`]: the job owner's `/etc/passwd` and `/etc/group` entries inside the container
//! - [`store`]: the SQLite queue and run history
//! - [`gpu`]: GPU inventory (NVML or simulated)
//! - [`scheduler`]: the pure placement function
//! - [`resources`]: CPU/RAM capacity and each job's share; shm, ulimits, IPC and HOME of containers
//! - [`executor`]: runs attempts in Docker
//! - [`slurm`]: the Slurm backend's decisions (spec → sbatch, states) and its Slurm client
//! - [`node_agent`]: `gantry daemon --node-agent`, each Slurm node's GPU samples for the GPUs view
//! - [`inbox`]: the drop folder
//! - [`notify`]: notifications (email, webhooks) from a durable outbox; [`metrics`]: the Prometheus endpoint
//! - [`policy`]: the lab config (`/etc/gantry/config.toml`): limits, admins, retention
//! - [`engine`]: the loop that ties them together
//! - [`api`] / [`client`]: the local HTTP+JSON API on a Unix socket; [`client::locate`] finds the engine
//! - [`machine_lock`]: one non-system engine per machine's GPUs
//! - [`machines`]: the remote workstations the app can switch to

pub mod access;
pub mod api;
pub mod cgroup;
pub mod client;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod defaults;
pub mod efficiency;
pub mod engine;
pub mod estimate;
pub mod executor;
pub mod gpu;
pub mod inbox;
pub mod machine_lock;
pub mod machines;
pub mod metrics;
pub mod node_agent;
pub mod notify;
pub mod outcome;
pub mod passwd;
pub mod policy;
pub mod protocol;
pub mod resources;
pub mod scheduler;
pub mod shell;
pub mod sim;
pub mod slurm;
pub mod spec;
pub mod staging;
pub mod store;
pub mod units;
