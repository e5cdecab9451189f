//! The job spec: one job per file, YAML or TOML, strictly checked.
//!
//! Parsing never panics and every error says where (line/column when known) and how to fix it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

pub use crate::units::{format_bytes, line_col, parse_bytes, parse_limit};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use ts_rs::TS;

mod de;
mod matrix;
mod mount;
mod parse;
mod session;
mod template;
mod validate;
pub use matrix::*;
pub(crate) use mount::*;
pub use parse::*;
pub use session::*;
pub use template::*;
pub use validate::*;

/// `image` of a job in this machine's own folders (also what an omitted `image` means).
pub const HOST_IMAGE: &str = "host";

/// What an `image: host` job sees of this machine, read-only (where the machine has them).
/// (`/sbin` is listed so nothing is mounted there; the container's own holds Docker's init.)
pub const HOST_SYSTEM_FOLDERS: [&str; 9] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
];

fn host_image() -> String {
    HOST_IMAGE.into()
}

impl JobSpec {
    /// Runs in this machine's own folders (`image: host`, or no `image`).
    pub fn is_host_image(&self) -> bool {
        self.image == HOST_IMAGE
    }
}

/// The most `ports` one job may serve.
pub const MAX_PORTS: usize = 16;
/// Largest spec file Gantry reads (drop folder and CLI alike).
pub const MAX_SPEC_BYTES: u64 = 1024 * 1024;

/// The command a job runs: either a list (exec form) or a string run by `/bin/sh -c`.
// Deserialize: by hand in `de.rs` (what is wrong, at which item), accepting what this serializes to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema, TS)]
#[serde(untagged)]
pub enum Command {
    /// A single string, run with `/bin/sh -c`.
    Shell(String),
    /// Program and arguments, run as is.
    Exec(Vec<String>),
}

impl Command {
    /// The argv handed to Docker. A string runs with `/bin/sh -c` so that signals reach its work
    /// (`shell::for_signals`: one command is `exec`'d; see [`Command::signals_group`]).
    pub fn argv(&self) -> Vec<String> {
        match self {
            Command::Shell(s) => vec!["/bin/sh".into(), "-c".into(), crate::shell::for_signals(s).0],
            Command::Exec(v) => v.clone(),
        }
    }
    /// Must Docker's init (tini) send a stop or checkpoint signal to the command's whole process
    /// group (`TINI_KILL_PROCESS_GROUP=1`) for it to reach the work? A string that is more than one
    /// command; never the list form, whose program gets its signals alone.
    pub fn signals_group(&self) -> bool {
        match self {
            Command::Shell(s) => crate::shell::for_signals(s).1,
            Command::Exec(_) => false,
        }
    }
    pub fn map(&self, f: impl Fn(&str) -> String) -> Command {
        match self {
            Command::Shell(s) => Command::Shell(f(s)),
            Command::Exec(v) => Command::Exec(v.iter().map(|s| f(s)).collect()),
        }
    }
    fn mentions(&self, needle: &str) -> bool {
        match self {
            Command::Shell(s) => s.contains(needle),
            Command::Exec(v) => v.iter().any(|s| s.contains(needle)),
        }
    }
}

/// A job as written by a researcher. Unknown fields are errors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, TS)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Gantry job spec")]
pub struct JobSpec {
    /// Short name shown in the queue and history. Defaults to the file name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Docker image, e.g. `paddlepaddle/paddle:2.6.1-gpu-cuda12.0-cudnn8.9-trt8.6`. Left out, or
    /// `host`: this machine's own system folders (`/usr`, `/etc`, `/opt`, … read-only) and your home
    /// (read-write), so your conda env or venv runs as on the machine, still in a container with
    /// its GPUs and limits (unless the lab turns it off).
    #[serde(default = "host_image")]
    pub image: String,
    /// Command: a list (exec form) or a string run with `/bin/sh -c`. Defaults to the image's CMD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Command>,
    /// Working directory inside the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// Extra environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Bind mounts, `host:container` or `host:container:ro`. Host paths are absolute or relative to the spec file;
    /// each must exist and be readable (for read-write mounts, writable) by the submitter.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<String>,
    /// TensorBoard log folder: the scalars of the event files in it (and in its subfolders) become
    /// the job's metrics (`gantry show`, `gantry compare`), read while it runs and at its end.
    /// Relative to `workdir`, or an absolute path inside the container under one of the job's mounts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensorboard: Option<String>,
    /// Number of GPUs (0 allowed). Default 1.
    #[serde(default = "default_gpus")]
    #[schemars(range(min = 0, max = 64))]
    pub gpus: i64,
    /// GPU memory needed on each GPU, e.g. `20GiB`. When set, the job may share a GPU with others whose
    /// declared memory fits; when absent, the job gets whole GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^\s*[0-9]+(\.[0-9]+)?\s*([KMGT]i?B?|B)?\s*$"))]
    pub gpu_memory: Option<String>,
    /// Only GPUs whose name contains this (any case), e.g. `H100` matches "NVIDIA H100 80GB HBM3".
    /// `gantry gpus` lists the names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// Only GPUs with at least this much memory in all, e.g. `40GiB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^\s*[0-9]+(\.[0-9]+)?\s*([KMGT]i?B?|B)?\s*$"))]
    pub min_gpu_memory: Option<String>,
    /// Higher runs first. Default 0.
    #[serde(default)]
    pub priority: i32,
    /// Wall-clock limit per attempt, e.g. `24h`, `90m`, counted from when it starts running. When it
    /// passes the job is stopped (SIGTERM, then SIGKILL after the grace period) and ends `timed_out`,
    /// never retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// How often to retry after a failure (a non-zero exit, out of memory, a lost container), with
    /// exponential backoff; never after a timeout or a cancel. Default 0.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub retries: i64,
    /// How long the job is expected to run (`2h`). Lets the scheduler backfill and estimate start times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_runtime: Option<String>,
    /// Start only after these jobs succeeded: job ids, or names of your earlier jobs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<IdOrName>,
    /// Start no earlier than this, in the workstation's local time: `22:00` (today, or tomorrow once
    /// past), `tomorrow 08:00`, `2026-12-03 09:30`, or `+2h` (from when it is queued). Until then it
    /// waits ("starts at 22:00") and holds no GPUs and no reservation. At most the lab's
    /// `max_begin` (a week) ahead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub begin: Option<String>,
    /// Job array: one job per combination of values, e.g. `{lr: [0.1, 0.01], bs: [32, 64]}` makes 4
    /// jobs. Each sees `{lr}` replaced in its command and `LR=0.1` in its environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub matrix: BTreeMap<String, Vec<Scalar>>,
    // Container settings for deep learning; each defaults to the lab config's `[containers]`.
    /// CPUs the job may use, e.g. `8` or `0.5`. Default: the lab's share per GPU (`cpus_per_gpu`), or
    /// `cpu_only_cpus` for a CPU-only job. The scheduler starts the job only when this many are free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.01, max = 1024))]
    pub cpus: Option<f64>,
    /// RAM limit, e.g. `64GiB` (swap is not added on top). Default: the lab's share per GPU
    /// (`memory_per_gpu`), or `cpu_only_memory` for a CPU-only job. Counted by the scheduler like CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^\s*[0-9]+(\.[0-9]+)?\s*([KMGT]i?B?|B)?\s*$"))]
    pub memory: Option<String>,
    /// Size of `/dev/shm` (PyTorch DataLoader workers pass batches through it), e.g. `16GiB`.
    /// Default: half the job's memory limit (8 GiB without one); Docker's own is 64 MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^\s*[0-9]+(\.[0-9]+)?\s*([KMGT]i?B?|B)?\s*$"))]
    pub shm_size: Option<String>,
    /// `private` (default) or `host`: share the host's IPC namespace (only where the lab config allows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipc: Option<Ipc>,
    /// Where `$HOME` points: `tmpfs` (an empty, writable folder for this job) or `mount` (your home
    /// folder, read-write; only where the lab config enables it). Default: the lab's `home`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<Home>,
    /// Resource limits. Default: `memlock: unlimited`, `stack: 64MiB` (NVIDIA's advice for PyTorch/NCCL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ulimits: Option<Ulimits>,
    /// The most processes and threads the job may have at once, e.g. `512` (a runaway fork stops
    /// there). Default, and the most a job may ask for: the lab's `pids_limit` (4096 unless the lab
    /// config says otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 16, max = 4194304))]
    pub pids_limit: Option<i64>,
    /// An interactive session (what `gantry shell` queues): the container gets a terminal that
    /// `gantry attach ID` joins, its command defaults to your login shell (or `/bin/sh` where the
    /// image lacks it), `timeout` is its length (bounded by the lab's `[sessions]`), it is never
    /// retried and goes before batch jobs. Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interactive: bool,
    /// Ports the job serves inside its container (a notebook, TensorBoard), e.g. `[8888]`.
    /// `gantry open ID [PORT]` gives you (only you) a URL on this machine's loopback that reaches
    /// it; nothing is published on the network. Serve on 127.0.0.1 inside the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    /// Which of this job's events notify you, e.g. `[failed, timed_out]` (`[]`: none), sent to every
    /// target of yours (`gantry notify add`), in place of each target's `--on` for this job. Events:
    /// started, finished, failed, timed_out, cancelled, preempted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<Vec<crate::protocol::notify::NotifyEvent>>,
    /// May Gantry stop this job (after its checkpoint signal and grace) and queue it again at its
    /// place, so that another job can start (the lab's `[preemption]` rules)? It then runs again from
    /// its checkpoint and sees `GANTRY_RESTART_COUNT`. Default: the lab's `default_preemptible`
    /// (`false` unless the lab config says otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemptible: Option<bool>,
    /// How a preempted job is told to save its work: `{signal: SIGUSR1, grace: 5m}`. Default: SIGTERM
    /// with the lab's stop grace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<Checkpoint>,
}

/// `checkpoint` in a spec: the signal a preempted job gets, and how long it has to save and exit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// `SIGTERM` (default), `SIGUSR1`, `SIGUSR2`, `SIGINT`, `SIGHUP` or `SIGQUIT` (with or without `SIG`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// Time from the signal to the stop, e.g. `5m`. Default: the lab's stop grace; at most 1 hour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace: Option<String>,
}

/// The signals a `checkpoint` may name (what frameworks use to save: Lightning SIGUSR1, HF SIGTERM).
pub const CHECKPOINT_SIGNALS: [&str; 6] = ["SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP", "SIGQUIT"];

/// The longest `checkpoint.grace`: a preemption may hold the GPUs it frees this long.
pub const MAX_CHECKPOINT_GRACE: Duration = Duration::from_secs(3600);

impl JobSpec {
    /// The checkpoint signal's name (`SIGTERM` unless the spec says), checked at submit.
    pub fn checkpoint_signal(&self) -> String {
        self.checkpoint
            .as_ref()
            .and_then(|c| c.signal.as_deref())
            .and_then(signal_name)
            .unwrap_or_else(|| "SIGTERM".into())
    }
    /// The checkpoint grace, if the spec sets one (else the lab's stop grace).
    pub fn checkpoint_grace(&self) -> Option<Duration> {
        self.checkpoint
            .as_ref()
            .and_then(|c| c.grace.as_deref())
            .and_then(|g| humantime::parse_duration(g.trim()).ok())
    }
}

/// `usr1`, `SIGUSR1`, `sigusr1` -> `SIGUSR1` (`None`: not a checkpoint signal).
pub fn signal_name(s: &str) -> Option<String> {
    let up = s.trim().to_ascii_uppercase();
    let full = if up.starts_with("SIG") { up } else { format!("SIG{up}") };
    CHECKPOINT_SIGNALS.contains(&full.as_str()).then_some(full)
}

/// `ipc` in a spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, TS)]
#[serde(rename_all = "lowercase")]
pub enum Ipc {
    Private,
    Host,
}

/// `home` in a spec and in the lab config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, TS)]
#[serde(rename_all = "lowercase")]
pub enum Home {
    Tmpfs,
    Mount,
}

/// `ulimits` in a spec: each `unlimited` or a size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct Ulimits {
    /// Locked memory (RDMA and pinned-memory transfers need it), e.g. `unlimited`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memlock: Option<String>,
    /// Stack size of each thread, e.g. `64MiB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<String>,
}

/// The container settings a spec asked for, parsed (`None`: the lab's default).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct Limits {
    /// CPUs in thousandths.
    pub cpus_milli: Option<u64>,
    pub memory: Option<u64>,
    pub shm_size: Option<u64>,
    /// Bytes; -1 is unlimited (Docker's and the kernel's convention).
    pub memlock: Option<i64>,
    pub stack: Option<i64>,
    /// Processes and threads at once.
    #[serde(default)]
    pub pids_limit: Option<i64>,
}

/// The range of `pids_limit`, in a spec and in the lab config: a job needs a few processes (its init,
/// a shell, the command); the kernel's own ceiling is 4194304.
pub const PIDS_LIMIT_RANGE: std::ops::RangeInclusive<i64> = 16..=4_194_304;

/// Docker refuses a memory limit below 6 MiB.
pub const MIN_MEMORY: u64 = 6 << 20;

/// A job reference in `after`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema, TS)]
#[serde(untagged)]
pub enum IdOrName {
    Id(i64),
    Name(String),
}

/// A matrix value.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema, TS)]
#[serde(untagged)]
pub enum Scalar {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Float(x) => write!(f, "{x}"),
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Str(s) => write!(f, "{s}"),
        }
    }
}

fn default_gpus() -> i64 {
    1
}

/// A spec that passed every check, with sizes and durations parsed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct ValidJob {
    pub name: String,
    pub spec: JobSpec,
    pub gpus: u32,
    /// Declared memory per GPU in bytes; `None` means whole GPUs.
    pub gpu_memory: Option<u64>,
    #[ts(type = "{ secs: number, nanos: number } | null")]
    pub timeout: Option<Duration>,
    pub retries: u32,
    pub mounts: Vec<Mount>,
    #[serde(default)]
    #[ts(type = "{ secs: number, nanos: number } | null")]
    pub expected_runtime: Option<Duration>,
    /// CPU, RAM, shm and ulimits the spec set (the engine fills in the lab's defaults).
    #[serde(default)]
    pub limits: Limits,
    /// Set on each job a `matrix` expanded into: its place among its siblings (the Slurm backend
    /// submits them together as one job array).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matrix_part: Option<MatrixPart>,
    /// `begin` as a moment (ms since the epoch), fixed when the job was queued (or previewed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable)]
    pub begin_ms: Option<i64>,
}

/// One job of a `matrix` expansion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct MatrixPart {
    /// Unique per expansion.
    pub group: String,
    pub index: u32,
    pub count: u32,
    /// This job's `matrix` values (its params in `gantry show` and `gantry compare`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, TS)]
pub struct Mount {
    pub host: String,
    pub container: String,
    pub read_only: bool,
}

/// Which syntax a spec is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Toml,
}

impl Format {
    /// From a file name; `None` when the extension is not one Gantry reads.
    pub fn from_name(name: &str) -> Option<Format> {
        let lower = name.to_ascii_lowercase();
        if lower.ends_with(".yaml") || lower.ends_with(".yml") {
            Some(Format::Yaml)
        } else if lower.ends_with(".toml") {
            Some(Format::Toml)
        } else {
            None
        }
    }
}

/// A spec problem: what, where, and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error, TS)]
pub struct SpecError {
    pub message: String,
    pub line: Option<usize>,
    pub column: Option<usize>,
    pub hint: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "line {l}, column {c}: ")?,
            (Some(l), None) => write!(f, "line {l}: ")?,
            _ => {}
        }
        write!(f, "{}", self.message)?;
        if !self.hint.is_empty() {
            write!(f, "\n  fix: {}", self.hint)?;
        }
        Ok(())
    }
}

impl SpecError {
    pub fn new(message: impl Into<String>, hint: impl Into<String>) -> Self {
        SpecError {
            message: message.into(),
            line: None,
            column: None,
            hint: hint.into(),
        }
    }
    fn at_key(mut self, text: &str, key: &str) -> Self {
        if let Some(line) = locate_key(text, key) {
            self.line = Some(line);
        }
        self
    }
}

/// JSON Schema of the spec, for editors.
pub fn json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(JobSpec)).expect("schema serializes")
}
#[cfg(test)]
mod tests;
