//! The Slurm backend: Slurm places and runs jobs; Gantry submits them as their owner, tracks them and
//! records them in its history.
//!
//! The decisions are pure functions tested by tables: a job → `sbatch` arguments ([`sbatch_args`]) and
//! batch script ([`batch_script`]), Slurm's state and reason → Gantry's ([`seen`], [`why_waiting`]), and
//! what to do with an attempt found open after a restart ([`resume`]). [`Slurm`] runs the commands
//! (`sbatch`, `squeue --json`, `scancel`, `scontrol`) and parses their JSON or key=value output, never
//! columns by position.

use std::collections::HashMap;
use std::ffi::CString;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::engine::outcome::How;
use crate::spec::ValidJob;

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
        Settings { partition: None, account: None, qos: None, poll: DEFAULT_POLL, log_dir: None, runtime: Runtime::Docker, shard_memory: None, max_nice: DEFAULT_MAX_NICE, jobcomp_log: None, node_samples: None }
    }
}

/// Something Slurm cannot do for this job, said so the user can act on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refusal(pub String);

/// One attempt to submit: the job and everything decided around it.
#[derive(Debug, Clone)]
pub struct Submission<'a> {
    pub job: &'a ValidJob,
    /// Unique per database, job and attempt: `gantry:<db>:<job>:<attempt>` (in `--comment`).
    pub marker: String,
    pub uid: u32,
    pub gid: u32,
    /// The owner's home (working directory on the node).
    pub home: PathBuf,
    /// Where Slurm writes the output.
    pub output: PathBuf,
    /// The user priority range of the lab (priority → nice).
    pub priority_range: (i32, i32),
    /// Slurm ids (`ID` or an array's `ID_TASK`) of the jobs this one runs after (`--dependency=afterok:`).
    pub after: Vec<String>,
    /// Mounts as checked with the owner's permissions (host paths).
    pub mounts: Vec<crate::access::ResolvedMount>,
}

/// The marker that finds a submitted attempt again: in `--comment`.
pub fn marker(db_uid: &str, job_id: i64, attempt_n: u32) -> String {
    format!("gantry:{db_uid}:{job_id}:{attempt_n}")
}

/// Gantry's priority onto Slurm's `--nice`: users may only lower their jobs (nice ≥ 0), so the top of
/// the lab's user range gets 0 and the bottom `max_nice`, linearly between; admin priorities above the
/// range also get 0.
pub fn nice_for(priority: i32, (lo, hi): (i32, i32), max_nice: u32) -> u32 {
    if hi <= lo {
        return 0;
    }
    let p = priority.clamp(lo, hi);
    ((hi - p) as f64 / (hi - lo) as f64 * max_nice as f64).round() as u32
}

/// Slurm's `--time` in whole minutes, rounded up: Slurm counts minutes (Gantry also stops the job at
/// its exact timeout).
fn minutes(d: Duration) -> u64 {
    d.as_secs().div_ceil(60).max(1)
}

/// A name as `--job-name` takes it: printable, no spaces (they would split `jobcomp` records).
fn job_name(name: &str) -> String {
    let n: String = name.chars().map(|c| if c.is_whitespace() || c.is_control() { '_' } else { c }).take(100).collect();
    if n.is_empty() { "gantry-job".into() } else { n }
}

/// The `sbatch` arguments of a job (the script comes on stdin).
pub fn sbatch_args(s: &Submission, set: &Settings) -> Result<Vec<String>, Refusal> {
    let job = s.job;
    let mut a = vec![
        "--parsable".to_string(),
        format!("--job-name={}", job_name(&job.name)),
        format!("--comment={}", s.marker),
        // The job gets the user's environment on the node, not the engine's (root's).
        "--export=NONE".into(),
        format!("--chdir={}", s.home.display()),
        format!("--output={}", s.output.display()),
    ];
    for (k, v) in [("partition", &set.partition), ("account", &set.account), ("qos", &set.qos)] {
        if let Some(v) = v {
            a.push(format!("--{k}={v}"));
        }
    }
    // The batch script passes the image to `docker run` after its options: `--privileged` as an
    // image would be read as one.
    if job.spec.image.starts_with('-') {
        return Err(Refusal(format!("`image` {:?} starts with '-': an image name is `repo/name:tag`", job.spec.image)));
    }
    if job.spec.min_gpu_memory.is_some() {
        return Err(Refusal("`min_gpu_memory` has no Slurm equivalent on this cluster: choose GPUs by `gpu_type` (a GRES type such as a100) instead".into()));
    }
    match (job.gpu_memory, set.shard_memory) {
        (Some(_), None) => {
            return Err(Refusal(
                "`gpu_memory` (sharing a GPU with other jobs) needs Slurm's `shard` GRES, which this cluster's Gantry config does not name: \
                 remove `gpu_memory` to get whole GPUs, or ask an admin to configure `shard` in Slurm and `shard_memory` in [slurm]"
                    .into(),
            ))
        }
        (Some(m), Some(per)) => {
            if job.spec.gpu_type.is_some() {
                return Err(Refusal("`gpu_type` cannot be combined with `gpu_memory` on Slurm (shards have no type): remove one of them".into()));
            }
            let shards = m.div_ceil(per.max(1)).max(1) * job.gpus.max(1) as u64;
            a.push(format!("--gres=shard:{shards}"));
        }
        (None, _) if job.gpus > 0 => match &job.spec.gpu_type {
            Some(t) => a.push(format!("--gres=gpu:{}:{}", t.trim().to_ascii_lowercase(), job.gpus)),
            None => a.push(format!("--gres=gpu:{}", job.gpus)),
        },
        (None, _) => {}
    }
    if let Some(c) = job.limits.cpus_milli {
        a.push(format!("--cpus-per-task={}", c.div_ceil(1000).max(1)));
    }
    if let Some(m) = job.limits.memory {
        a.push(format!("--mem={}M", m.div_ceil(1 << 20).max(1)));
    }
    if let Some(t) = job.timeout {
        a.push(format!("--time={}", minutes(t)));
    }
    let nice = nice_for(job.spec.priority, s.priority_range, set.max_nice);
    if nice > 0 {
        a.push(format!("--nice={nice}"));
    }
    if !s.after.is_empty() {
        a.push(format!("--dependency=afterok:{}", s.after.join(":")));
        // A dependency that fails ends this job at once instead of leaving it pending for good.
        a.push("--kill-on-invalid-dep=yes".into());
    }
    Ok(a)
}

/// The line the batch script writes when Docker killed the job at its memory limit (Slurm itself only
/// sees a failed job); Gantry records the attempt as out of memory when the output ends with it.
pub const OOM_LINE: &str = "gantry: the job was killed at its memory limit (out of memory)";

/// An exit with code 137 whose output ends with [`OOM_LINE`] was an OOM kill.
pub fn oom_from_output(how: How, tail: &[u8]) -> How {
    match how {
        How::Exited { code, oom: false } if code == 137 && String::from_utf8_lossy(tail).lines().rev().take(3).any(|l| l.trim() == OOM_LINE) => How::Exited { code, oom: true },
        other => other,
    }
}

/// `'…'` for sh.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The batch script: runs the job's image on the node Slurm chose, as the owner, with the GPUs Slurm
/// allocated (`SLURM_JOB_GPUS`, the node's GPU indexes). Slurm's SIGTERM (cancel, time limit) stops
/// the container too.
pub fn batch_script(s: &Submission, job_id: i64, attempt_n: u32, runtime: Runtime) -> String {
    let mut out = format!("#!/bin/sh\n# Gantry job {job_id}, attempt {attempt_n} ({}): written by the Gantry engine, run by Slurm as the job's owner.\n", s.marker);
    out.push_str(&script_body(s, job_id, attempt_n, runtime));
    out
}

/// The batch script of a `matrix` submitted as one job array: each task runs its own job (`parts`:
/// task id, submission, Gantry job id), chosen by `SLURM_ARRAY_TASK_ID`.
pub fn array_script(parts: &[(u32, Submission, i64)], marker: &str, runtime: Runtime) -> String {
    let mut out = format!("#!/bin/sh\n# Gantry jobs {} as one Slurm job array ({marker}): written by the Gantry engine, run by Slurm as their owner.\n", parts.iter().map(|p| p.2.to_string()).collect::<Vec<_>>().join(", "));
    out.push_str("case \"${SLURM_ARRAY_TASK_ID:-}\" in\n");
    for (task, s, job_id) in parts {
        out.push_str(&format!("{task})\n"));
        out.push_str(&script_body(s, *job_id, 1, runtime));
        out.push_str(";;\n");
    }
    out.push_str("esac\necho \"gantry: no job for array task ${SLURM_ARRAY_TASK_ID:-}\" >&2\nexit 1\n");
    out
}

/// `--array=` of the given task ids.
pub fn array_arg(tasks: &[u32]) -> String {
    format!("--array={}", tasks.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(","))
}

/// The marker of a `matrix` submitted as one array (in `--comment` of every task).
pub fn array_marker(db_uid: &str, group: &str) -> String {
    format!("gantry:{db_uid}:array:{group}")
}

/// Where Slurm's view of an attempt is: its own job, or its task of an array (a task not started
/// yet shows in the array's pending record, whose `array_task_string` lists it).
pub fn find_job(jobs: &HashMap<u64, SqJob>, id: u64, task: Option<u32>) -> Option<&SqJob> {
    let Some(t) = task else { return jobs.get(&id) };
    jobs.values()
        .find(|j| number(&j.array_job_id) == Some(id as i64) && number(&j.array_task_id) == Some(t as i64))
        .or_else(|| jobs.get(&id).filter(|j| number(&j.array_task_id).is_none() && task_list(&j.array_task_string).contains(&t)))
}

/// The ids of the Slurm jobs of user `uid` whose comment is `marker` (an array's tasks: the array's
/// id). Anyone can put any comment on their own jobs, so a job of another user is never taken.
pub fn marked(jobs: &[SqJob], marker: &str, uid: u32) -> Vec<u64> {
    jobs.iter()
        .filter(|j| j.comment.as_deref() == Some(marker) && number(&j.user_id) == Some(uid as i64))
        .map(|j| number(&j.array_job_id).filter(|a| *a > 0).map(|a| a as u64).unwrap_or(j.job_id))
        .collect()
}

/// `0,2,5`, `1-3`, `0-9%2` → the task ids.
pub fn task_list(s: &str) -> Vec<u32> {
    let s = s.split('%').next().unwrap_or("");
    let mut out = vec![];
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (range, step) = part.split_once(':').unwrap_or((part, "1"));
        let step: u32 = step.parse().unwrap_or(1).max(1);
        match range.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    out.extend((a..=b).step_by(step as usize));
                }
            }
            None => out.extend(range.parse::<u32>().ok()),
        }
    }
    out
}

fn script_body(s: &Submission, job_id: i64, attempt_n: u32, runtime: Runtime) -> String {
    let job = s.job;
    let q = |v: &str| sh_quote(v);
    let mut env: Vec<(String, String)> = job.spec.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    env.retain(|(k, _)| !["GANTRY_JOB_ID", "GANTRY_ATTEMPT", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"].contains(&k.as_str()));
    env.push(("GANTRY_JOB_ID".into(), job_id.to_string()));
    env.push(("GANTRY_ATTEMPT".into(), attempt_n.to_string()));
    let cmd: Vec<String> = job.spec.command.as_ref().map(|c| c.argv()).unwrap_or_default();
    let mut out = String::new();
    out.push_str("export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n");
    out.push_str("# The GPUs Slurm allocated, as the node numbers them; inside, the job sees them as 0..N-1.\n");
    out.push_str("gpus=\"${SLURM_JOB_GPUS:-}\"\n");
    out.push_str("visible=$(echo \"$gpus\" | awk -F, 'NF{for(i=0;i<NF;i++) printf \"%s%d\", (i?\",\":\"\"), i}')\n");
    match runtime {
        Runtime::Docker => {
            out.push_str("name=\"gantry-slurm-$SLURM_JOB_ID\"\n");
            out.push_str("if [ -n \"$gpus\" ]; then set -- --gpus \"\\\"device=$gpus\\\"\"; else set -- -e NVIDIA_VISIBLE_DEVICES=void; fi\n");
            let mut run = vec![
                "docker run --name \"$name\" --init".to_string(),
                format!("--user {}:{}", s.uid, s.gid),
                "--security-opt no-new-privileges --cap-drop ALL".into(),
                "-e CUDA_VISIBLE_DEVICES=\"$visible\" -e GANTRY_SLURM_GPUS=\"$gpus\"".into(),
            ];
            if let Some(c) = job.limits.cpus_milli {
                run.push(format!("--cpus {}", c as f64 / 1000.0));
            }
            if let Some(m) = job.limits.memory {
                run.push(format!("--memory {m} --memory-swap {m}"));
            }
            for m in &s.mounts {
                run.push(format!("--mount {}", q(&format!("type=bind,source={},target={}{}", m.host.display(), m.container, if m.read_only { ",readonly" } else { "" }))));
            }
            if let Some(w) = &job.spec.workdir {
                run.push(format!("-w {}", q(w)));
            }
            for (k, v) in &env {
                run.push(format!("-e {}", q(&format!("{k}={v}"))));
            }
            run.push("\"$@\"".into());
            run.push(q(&job.spec.image));
            run.extend(cmd.iter().map(|c| q(c)));
            out.push_str(&run.join(" \\\n  "));
            out.push_str(" &\npid=$!\n");
            out.push_str("# Cancel and time limit: Slurm signals this script; stop the container, not just its client.\n");
            out.push_str("trap 'docker stop -t 10 \"$name\" >/dev/null 2>&1' TERM INT\n");
            out.push_str("wait \"$pid\"; code=$?\n");
            out.push_str("while kill -0 \"$pid\" 2>/dev/null; do wait \"$pid\"; code=$?; done\n");
            out.push_str("# Killed at its memory limit: say so (Gantry records it as out of memory), then remove the container.\n");
            out.push_str("[ \"$(docker inspect -f '{{.State.OOMKilled}}' \"$name\" 2>/dev/null)\" = true ] && echo \"");
            out.push_str(OOM_LINE);
            out.push_str("\" >&2\n");
            out.push_str("docker rm -f \"$name\" >/dev/null 2>&1\n");
            out.push_str("exit \"$code\"\n");
            return out;
        }
        Runtime::Apptainer => {
            let mut run = vec!["apptainer exec --nv --containall --no-home".to_string(), "--env CUDA_VISIBLE_DEVICES=\"$visible\" --env GANTRY_SLURM_GPUS=\"$gpus\"".into()];
            for m in &s.mounts {
                run.push(format!("--bind {}", q(&format!("{}:{}{}", m.host.display(), m.container, if m.read_only { ":ro" } else { "" }))));
            }
            if let Some(w) = &job.spec.workdir {
                run.push(format!("--pwd {}", q(w)));
            }
            for (k, v) in &env {
                run.push(format!("--env {}", q(&format!("{k}={v}"))));
            }
            run.push(q(&format!("docker://{}", job.spec.image)));
            run.extend(cmd.iter().map(|c| q(c)));
            out.push_str(&run.join(" \\\n  "));
            out.push_str(" &\npid=$!\n");
            out.push_str("trap 'kill -TERM \"$pid\" 2>/dev/null' TERM INT\n");
        }
    }
    out.push_str("wait \"$pid\"; code=$?\n");
    out.push_str("while kill -0 \"$pid\" 2>/dev/null; do wait \"$pid\"; code=$?; done\n");
    out.push_str("exit \"$code\"\n");
    out
}

/// A job as `squeue --json` shows it (only what Gantry reads; the rest is ignored).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct SqJob {
    pub job_id: u64,
    /// A string in 22.05; a list of flags in later versions.
    pub job_state: serde_json::Value,
    #[serde(default)]
    pub state_reason: String,
    /// The raw wait status in 22.05 (`exit 3` reads 768); an object in later versions.
    #[serde(default)]
    pub exit_code: serde_json::Value,
    #[serde(default)]
    pub comment: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub user_name: Option<String>,
    #[serde(default)]
    pub user_id: serde_json::Value,
    #[serde(default)]
    pub start_time: serde_json::Value,
    #[serde(default)]
    pub nodes: Option<String>,
    #[serde(default)]
    pub gres_detail: Vec<String>,
    #[serde(default)]
    pub array_job_id: serde_json::Value,
    #[serde(default)]
    pub array_task_id: serde_json::Value,
    /// The tasks of an array not started yet (its pending record).
    #[serde(default)]
    pub array_task_string: String,
}

#[derive(Deserialize)]
struct SqueueOut {
    jobs: Vec<SqJob>,
}

/// `squeue --json`'s jobs.
pub fn parse_squeue(json: &[u8]) -> Result<Vec<SqJob>, SlurmError> {
    // Slurm writes job names and comments byte for byte: one user's invalid UTF-8 must not stop
    // Gantry reading everyone's jobs.
    let json = String::from_utf8_lossy(json);
    serde_json::from_str::<SqueueOut>(&json).map(|o| o.jobs).map_err(|e| SlurmError::Parse(format!("squeue --json: {e}")))
}

pub fn number(v: &serde_json::Value) -> Option<i64> {
    match v {
        serde_json::Value::Number(n) => n.as_i64(),
        serde_json::Value::Object(o) => o.get("number").and_then(|n| n.as_i64()).filter(|_| o.get("set").and_then(|s| s.as_bool()).unwrap_or(true)),
        _ => None,
    }
}

impl SqJob {
    pub fn state(&self) -> String {
        match &self.job_state {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(a) => a.first().and_then(|s| s.as_str()).unwrap_or("").to_string(),
            _ => String::new(),
        }
    }

    /// The exit code as a shell reports it (a signal `n` reads 128 + n).
    pub fn exit(&self) -> Option<i64> {
        match &self.exit_code {
            serde_json::Value::Object(o) => {
                let sig = o.get("signal").and_then(|s| number(s.get("id").unwrap_or(&serde_json::Value::Null)));
                match sig.filter(|s| *s > 0) {
                    Some(s) => Some(128 + s),
                    None => o.get("return_code").and_then(number),
                }
            }
            v => number(v).map(decode_wait_status),
        }
    }

    pub fn started_at_s(&self) -> Option<i64> {
        number(&self.start_time).filter(|t| *t > 0)
    }

    /// The node's GPU indexes from `gres_detail` (`gpu:2(IDX:0-1)`, `gpu:a100:3(IDX:0,2-3)`).
    pub fn gpu_indexes(&self) -> Vec<u32> {
        self.gres_detail.iter().flat_map(|d| gpu_indexes(d)).collect()
    }
}

/// `gpu:2(IDX:0-1)` → [0, 1].
pub fn gpu_indexes(detail: &str) -> Vec<u32> {
    let Some(rest) = detail.strip_prefix("gpu").and_then(|r| r.split_once("IDX:")).map(|(_, r)| r) else { return vec![] };
    let list = rest.split(')').next().unwrap_or("");
    let mut out = vec![];
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    out.extend(a..=b);
                }
            }
            None => out.extend(part.parse::<u32>().ok()),
        }
    }
    out
}

/// A wait status as the shell reports it: the exit code, or 128 + the signal.
pub fn decode_wait_status(raw: i64) -> i64 {
    if raw & 0x7f != 0 {
        128 + (raw & 0x7f)
    } else {
        (raw >> 8) & 0xff
    }
}

/// What Gantry makes of a Slurm job's state.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen {
    /// Waiting in Slurm's queue: why, in words for `gantry ls`.
    Pending(String),
    Running,
    /// It ended: how.
    Ended(How),
}

/// Slurm state + reason (+ exit code, whether it ever started) → Gantry's view. `stopped_by_gantry`
/// says why Gantry itself cancelled it, if it did (its owner's cancel, or the timeout Gantry enforces).
pub fn seen(state: &str, reason: &str, exit: Option<i64>, started: bool, stopped_by_gantry: Option<Stop>, timeout_ms: Option<i64>) -> Seen {
    let code = exit;
    match state {
        "PENDING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "RESV_DEL_HOLD" | "SPECIAL_EXIT" => Seen::Pending(why_waiting(reason)),
        "RUNNING" | "CONFIGURING" | "COMPLETING" | "SUSPENDED" | "STOPPED" | "SIGNALING" | "STAGE_OUT" | "RESIZING" => Seen::Running,
        "COMPLETED" => Seen::Ended(How::Exited { code: code.unwrap_or(0), oom: false }),
        "FAILED" => Seen::Ended(How::Exited { code: code.filter(|c| *c != 0).unwrap_or(1), oom: false }),
        "OUT_OF_MEMORY" => Seen::Ended(How::Exited { code: code.unwrap_or(137), oom: true }),
        "TIMEOUT" => Seen::Ended(How::TimedOut { code, timeout_ms: timeout_ms.unwrap_or(0) }),
        "CANCELLED" => Seen::Ended(match stopped_by_gantry {
            Some(Stop::Timeout) => How::TimedOut { code, timeout_ms: timeout_ms.unwrap_or(0) },
            _ if reason.starts_with("Dependency") || reason == "DependencyNeverSatisfied" => {
                How::Refused("a job it runs after did not succeed, so Slurm cancelled it".into())
            }
            _ if !started => How::CancelledBeforeStart,
            _ => How::Cancelled { code },
        }),
        "NODE_FAIL" | "BOOT_FAIL" | "PREEMPTED" | "DEADLINE" | "REVOKED" => Seen::Ended(How::Lost(format!("Slurm ended it: {state}{}", if reason.is_empty() || reason == "None" { String::new() } else { format!(" ({reason})") }))),
        other => Seen::Pending(format!("in Slurm state {other}")),
    }
}

/// Why Gantry stopped a job itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Cancel,
    Timeout,
}

/// A PENDING reason in words (the reason itself stays in parentheses: admins know it).
pub fn why_waiting(reason: &str) -> String {
    let text = match reason {
        "Resources" => "waiting for GPUs, CPUs or memory to free up in Slurm",
        "Priority" => "other jobs come first in Slurm's order",
        "Dependency" => "waiting for the jobs it runs after to succeed",
        "DependencyNeverSatisfied" => "a job it runs after failed; it will not run",
        "BeginTime" => "waiting for its start time",
        "JobHeldUser" => "held by its owner in Slurm",
        "JobHeldAdmin" => "held by a Slurm admin",
        "QOSMaxGRESPerUser" => "you already hold the most GPUs your QOS allows per user",
        "QOSMaxJobsPerUserLimit" => "you already run the most jobs your QOS allows per user",
        "QOSGrpGRES" | "AssocGrpGRES" => "the group's GPU limit is reached",
        "ReqNodeNotAvail" => "the nodes it needs are not available (down, drained or reserved)",
        "PartitionDown" | "PartitionInactive" => "the partition is down",
        "PartitionTimeLimit" => "its timeout is longer than the partition allows",
        "PartitionNodeLimit" | "BadConstraints" => "no node of the partition can ever run it (ask for less)",
        "" | "None" => "submitted; waiting for Slurm's next scheduling pass",
        _ => "",
    };
    if text.is_empty() {
        format!("waiting in Slurm ({reason})")
    } else if reason.is_empty() || reason == "None" {
        text.to_string()
    } else {
        format!("{text} ({reason})")
    }
}

/// What to do with an attempt found open after an engine restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resume {
    /// Its Slurm id is recorded: follow it.
    Follow(u64),
    /// The engine stopped between `sbatch` and recording the id: found by its marker, record it, follow it.
    Adopt(u64),
    /// Never reached Slurm: the attempt never ran; queue the job again (it is submitted once, by the next pass).
    NeverSubmitted,
}

/// `recorded`: the Slurm id in the attempt; `found`: Slurm jobs carrying the attempt's marker.
pub fn resume(recorded: Option<u64>, found: &[u64]) -> Resume {
    match (recorded, found.iter().min()) {
        (Some(id), _) => Resume::Follow(id),
        (None, Some(id)) => Resume::Adopt(*id),
        (None, None) => Resume::NeverSubmitted,
    }
}

/// A finished job's record in the `jobcomp/filetxt` log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    pub job_id: u64,
    pub state: String,
    pub exit: Option<i64>,
    pub started: bool,
}

/// The last record of `job_id` in a jobcomp/filetxt log: each line is `Key=Value` fields (a value
/// with spaces continues until the next `Key=`).
pub fn parse_jobcomp(text: &str, job_id: u64, uid: u32) -> Option<Completed> {
    parse_jobcomp_of(text, job_id, None, uid)
}

/// [`parse_jobcomp`] for a job, or for task `task` of array `job_id` (`ArrayJobId=… ArrayTaskId=…`).
///
/// Names and working directories are written unescaped (spaces, newlines), so any user can put a
/// line that looks like another job's record into the log: only a record of the owner (`uid`,
/// `UserId=` its second field) counts, and two such records for the same job mean one is forged, so
/// neither is taken.
pub fn parse_jobcomp_of(text: &str, job_id: u64, task: Option<u32>, uid: u32) -> Option<Completed> {
    let want = match task {
        None => format!("JobId={job_id} "),
        Some(t) => format!(" ArrayJobId={job_id} ArrayTaskId={t} "),
    };
    let owner = format!("({uid})");
    let mut found = text.lines().filter(|l| {
        l.starts_with("JobId=")
            && l.split(' ').nth(1).is_some_and(|u| u.starts_with("UserId=") && u.ends_with(&owner))
            && if task.is_none() { l.starts_with(&want) } else { format!("{l} ").contains(&want) }
    });
    let line = found.next()?;
    if found.next().is_some() {
        return None;
    }
    let mut kv: HashMap<String, String> = HashMap::new();
    let mut last: Option<String> = None;
    for tok in line.split(' ').filter(|t| !t.is_empty()) {
        match tok.split_once('=') {
            Some((k, v)) if !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric()) => {
                kv.insert(k.to_string(), v.to_string());
                last = Some(k.to_string());
            }
            _ => {
                if let Some(k) = &last {
                    kv.entry(k.clone()).and_modify(|v| {
                        v.push(' ');
                        v.push_str(tok)
                    });
                }
            }
        }
    }
    let exit = kv.get("ExitCode").and_then(|e| {
        let (code, sig) = e.split_once(':').unwrap_or((e, "0"));
        let sig: i64 = sig.parse().unwrap_or(0);
        if sig > 0 { Some(128 + sig) } else { code.parse().ok() }
    });
    Some(Completed {
        job_id,
        state: kv.get("JobState").cloned().unwrap_or_default(),
        exit,
        started: kv.get("StartTime").is_some_and(|s| !s.is_empty() && s != "Unknown" && s != "None"),
    })
}

/// A node as `scontrol show node -o` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub state: String,
    /// GPUs configured (`Gres=gpu:4` or `gpu:a100:4`) and their type, if named.
    pub gpus: u32,
    pub gpu_type: Option<String>,
    /// GPU indexes in use (`GresUsed=gpu:2(IDX:0-1)`).
    pub gpus_used: Vec<u32>,
}

/// `scontrol show node -o`: one line per node of `Key=Value` fields.
pub fn parse_nodes(text: &str) -> Vec<Node> {
    text.lines()
        .filter(|l| l.starts_with("NodeName="))
        .map(|l| {
            let kv: HashMap<&str, &str> = l.split(' ').filter_map(|t| t.split_once('=')).collect();
            let gres = kv.get("Gres").copied().unwrap_or("");
            let (gpus, gpu_type) = gres
                .split(',')
                .find_map(|g| {
                    let parts: Vec<&str> = g.split('(').next()?.split(':').collect();
                    match parts.as_slice() {
                        ["gpu", n] => Some((n.parse().ok()?, None)),
                        ["gpu", t, n] => Some((n.parse().ok()?, Some(t.to_string()))),
                        _ => None,
                    }
                })
                .unwrap_or((0, None));
            Node {
                name: kv.get("NodeName").copied().unwrap_or("").to_string(),
                state: kv.get("State").copied().unwrap_or("").to_string(),
                gpus,
                gpu_type,
                gpus_used: kv.get("GresUsed").map(|g| g.split(',').flat_map(gpu_indexes).collect()).unwrap_or_default(),
            }
        })
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error("Slurm is not reachable: {0}")]
    Unavailable(String),
    #[error("Slurm refused the job: {0}")]
    Rejected(String),
    #[error("cannot read Slurm's answer: {0}")]
    Parse(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl SlurmError {
    /// Errors that say nothing about the job: submit again later.
    pub fn is_transient(&self) -> bool {
        matches!(self, SlurmError::Unavailable(_) | SlurmError::Io(_))
    }
}

/// Who a Slurm command runs as.
#[derive(Debug, Clone)]
pub struct As {
    pub name: String,
    pub uid: u32,
}

/// Runs Slurm's commands.
#[derive(Debug, Clone, Default)]
pub struct Slurm;

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl Slurm {
    /// `program args` as `who`: through `runuser` when the engine is root and `who` is not (the job's
    /// owner submits and cancels, never root), else directly. The environment is cleared.
    fn command(who: Option<&As>, program: &str, args: &[String]) -> tokio::process::Command {
        let root = nix::unistd::geteuid().is_root();
        let mut c = match who {
            Some(u) if root && u.uid != 0 => {
                let mut c = tokio::process::Command::new("runuser");
                c.args(["-u", &u.name, "--", program]);
                c
            }
            _ => tokio::process::Command::new(program),
        };
        c.args(args).env_clear().env("PATH", PATH).kill_on_drop(true).stdin(std::process::Stdio::null());
        c
    }

    async fn output(mut c: tokio::process::Command, what: &str) -> Result<Vec<u8>, SlurmError> {
        let out = c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).output().await?;
        if out.status.success() {
            return Ok(out.stdout);
        }
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if err.contains("Unable to contact slurm controller") || err.contains("Socket timed out") || err.contains("Connection refused") || err.contains("munge") {
            Err(SlurmError::Unavailable(format!("{what}: {err}")))
        } else {
            Err(SlurmError::Rejected(if err.is_empty() { format!("{what} exited with {}", out.status) } else { err }))
        }
    }

    /// `sbatch` as the job's owner, the script on stdin; returns the Slurm job id.
    pub async fn submit(&self, who: &As, args: &[String], script: &str) -> Result<u64, SlurmError> {
        use tokio::io::AsyncWriteExt;
        let mut c = Self::command(Some(who), "sbatch", args);
        c.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        let mut child = c.spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(script.as_bytes()).await?;
        }
        let out = child.wait_with_output().await?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
            return Err(if err.contains("Unable to contact slurm controller") || err.contains("Socket timed out") {
                SlurmError::Unavailable(err)
            } else {
                SlurmError::Rejected(err)
            });
        }
        // `--parsable`: `ID` or `ID;CLUSTER`.
        text.split(';').next().and_then(|s| s.trim().parse().ok()).ok_or_else(|| SlurmError::Parse(format!("sbatch printed {text:?}")))
    }

    /// Every job Slurm knows (pending, running, and those that ended within `MinJobAge`).
    pub async fn queue(&self) -> Result<Vec<SqJob>, SlurmError> {
        let out = Self::output(Self::command(None, "squeue", &["--json".into()]), "squeue --json").await?;
        parse_squeue(&out)
    }

    /// `scancel ID` (or `ID_TASK`) as the job's owner.
    pub async fn cancel(&self, who: &As, target: &str) -> Result<(), SlurmError> {
        Self::output(Self::command(Some(who), "scancel", &[target.to_string()]), "scancel").await.map(|_| ())
    }

    pub async fn nodes(&self) -> Result<Vec<Node>, SlurmError> {
        let out = Self::output(Self::command(None, "scontrol", &["show".into(), "node".into(), "-o".into()]), "scontrol show node").await?;
        Ok(parse_nodes(&String::from_utf8_lossy(&out)))
    }

    /// Where `jobcomp/filetxt` writes (`JobCompLoc`), when that is the plugin.
    pub async fn jobcomp_log(&self) -> Option<PathBuf> {
        let out = Self::output(Self::command(None, "scontrol", &["show".into(), "config".into()]), "scontrol show config").await.ok()?;
        let text = String::from_utf8_lossy(&out);
        let get = |key: &str| text.lines().find_map(|l| l.split_once('=').filter(|(k, _)| k.trim() == key).map(|(_, v)| v.trim().to_string()));
        (get("JobCompType").as_deref() == Some("jobcomp/filetxt")).then(|| get("JobCompLoc")).flatten().map(PathBuf::from)
    }
}

/// The directory a user's Slurm output goes to under the shared log dir: `<log_dir>/<uid>`, made by
/// the engine, owned by the user, mode 0700. An existing one must be a real directory (not a link)
/// owned by them.
pub fn user_log_dir(log_dir: &Path, uid: u32, gid: u32) -> Result<PathBuf, Refusal> {
    let d = log_dir.join(uid.to_string());
    match std::fs::symlink_metadata(&d) {
        Ok(m) if m.file_type().is_dir() && m.uid() == uid => Ok(d),
        Ok(_) => Err(Refusal(format!("{} is not a folder owned by the job's owner; an admin must remove it", d.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir(&d).map_err(|e| Refusal(format!("cannot make {}: {e}", d.display())))?;
            let undo = |e: std::io::Error| {
                let _ = std::fs::remove_dir(&d);
                Refusal(format!("cannot hand {} to the job's owner: {e}", d.display()))
            };
            std::os::unix::fs::chown(&d, Some(uid), Some(gid)).map_err(undo)?;
            std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700)).map_err(undo)?;
            Ok(d)
        }
        Err(e) => Err(Refusal(format!("cannot check {}: {e}", d.display()))),
    }
}

fn open_at(dir: Option<&OwnedFd>, path: &Path, flags: i32) -> std::io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let base = dir.map(|d| d.as_raw_fd()).unwrap_or(libc::AT_FDCWD);
    // SAFETY: a valid C string and directory fd; the returned fd is owned below.
    let fd = unsafe { libc::openat(base, c.as_ptr(), flags | libc::O_CLOEXEC | libc::O_NOFOLLOW) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is not owned elsewhere.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Read a job's Slurm output from `offset`, as root, without following anything the user controls:
/// the user's folder and the file are opened with `O_NOFOLLOW` and must be a directory and a regular
/// file owned by the job's owner. A user who swaps their log for a link to `/etc/shadow` (or a FIFO,
/// or a hard link to a file they do not own) gets an error in their log, never the file.
pub fn read_output(log_dir: &Path, uid: u32, file: &str, offset: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Error, ErrorKind, Seek, SeekFrom};
    let top = open_at(None, log_dir, libc::O_RDONLY | libc::O_DIRECTORY)?;
    let dir = open_at(Some(&top), Path::new(&uid.to_string()), libc::O_RDONLY | libc::O_DIRECTORY)?;
    let mut f = std::fs::File::from(open_at(Some(&dir), Path::new(file), libc::O_RDONLY | libc::O_NONBLOCK)?);
    let dm = std::fs::File::from(dir).metadata()?;
    let fm = f.metadata()?;
    if dm.uid() != uid || !fm.file_type().is_file() || fm.uid() != uid {
        return Err(Error::new(ErrorKind::PermissionDenied, "the job's output is not a plain file owned by the job's owner; not read"));
    }
    f.seek(SeekFrom::Start(offset))?;
    let mut buf = vec![];
    f.take(16 << 20).read_to_end(&mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{validate_text, Format, Origin};

    fn job(yaml: &str) -> ValidJob {
        validate_text(yaml, Format::Yaml, &Origin::default()).unwrap()
    }

    fn sub(j: &ValidJob) -> Submission<'_> {
        Submission {
            job: j,
            marker: "gantry:db:7:1".into(),
            uid: 1001,
            gid: 1001,
            home: "/home/ann".into(),
            output: "/logs/1001/db-7-a1.out".into(),
            priority_range: (-10, 10),
            after: vec![],
            mounts: vec![],
        }
    }

    #[test]
    fn spec_to_sbatch_table() {
        let base = ["--parsable", "--comment=gantry:db:7:1", "--export=NONE", "--chdir=/home/ann", "--output=/logs/1001/db-7-a1.out"];
        let set = Settings { partition: Some("gpu".into()), account: Some("lab".into()), qos: Some("normal".into()), ..Default::default() };
        let def = Settings::default();
        let shard = Settings { shard_memory: Some(10 << 30), ..Default::default() };
        // (spec, settings, after, expected extra arguments, or the refusal's text)
        let rows: Vec<(&str, &Settings, Vec<&str>, Result<Vec<&str>, &str>)> = vec![
            ("name: t\nimage: a\ngpus: 2\n", &def, vec![], Ok(vec!["--job-name=t", "--gres=gpu:2", "--nice=1000"])),
            ("name: t\nimage: a\ngpus: 0\n", &def, vec![], Ok(vec!["--job-name=t", "--nice=1000"])),
            ("name: my run\nimage: a\ngpus: 1\ngpu_type: A100\n", &def, vec![], Ok(vec!["--job-name=my_run", "--gres=gpu:a100:1", "--nice=1000"])),
            (
                "name: t\nimage: a\ngpus: 1\ncpus: 2.5\nmemory: 3GiB\ntimeout: 90s\n",
                &set,
                vec![],
                Ok(vec!["--job-name=t", "--partition=gpu", "--account=lab", "--qos=normal", "--gres=gpu:1", "--cpus-per-task=3", "--mem=3072M", "--time=2", "--nice=1000"]),
            ),
            ("name: t\nimage: a\ngpus: 1\npriority: -10\n", &def, vec![], Ok(vec!["--job-name=t", "--gres=gpu:1", "--nice=2000"])),
            ("name: t\nimage: a\ngpus: 1\npriority: 0\n", &def, vec![], Ok(vec!["--job-name=t", "--gres=gpu:1", "--nice=1000"])),
            ("name: t\nimage: a\ngpus: 1\npriority: 10\n", &def, vec![], Ok(vec!["--job-name=t", "--gres=gpu:1"])),
            (
                "name: t\nimage: a\ngpus: 1\n",
                &def,
                vec!["11", "12_3"],
                Ok(vec!["--job-name=t", "--gres=gpu:1", "--nice=1000", "--dependency=afterok:11:12_3", "--kill-on-invalid-dep=yes"]),
            ),
            ("name: t\nimage: a\ngpu_memory: 15GiB\n", &shard, vec![], Ok(vec!["--job-name=t", "--gres=shard:2", "--nice=1000"])),
            ("name: t\nimage: a\ngpu_memory: 15GiB\n", &def, vec![], Err("needs Slurm's `shard` GRES")),
            ("name: t\nimage: a\ngpus: 1\nmin_gpu_memory: 40GiB\n", &def, vec![], Err("no Slurm equivalent")),
            ("name: t\nimage: --privileged\ncommand: [alpine, sh]\n", &def, vec![], Err("starts with '-'")),
        ];
        for (spec, set, after, want) in rows {
            let j = job(spec);
            let s = Submission { after: after.into_iter().map(String::from).collect(), ..sub(&j) };
            match (sbatch_args(&s, set), want) {
                (Ok(got), Ok(extra)) => {
                    let mut want: Vec<String> = base.iter().map(|s| s.to_string()).collect();
                    want.splice(1..1, [extra[0].to_string()]);
                    want.extend(extra[1..].iter().map(|s| s.to_string()));
                    assert_eq!(got, want, "{spec}");
                }
                (Err(e), Err(text)) => assert!(e.0.contains(text), "{spec}: {e}"),
                (got, want) => panic!("{spec}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn priority_maps_linearly_onto_non_negative_nice() {
        let rows = [(10, 0), (5, 500), (0, 1000), (-10, 2000), (1000, 0), (-1000, 2000)];
        for (p, nice) in rows {
            assert_eq!(nice_for(p, (-10, 10), 2000), nice, "priority {p}");
        }
        assert_eq!(nice_for(3, (0, 0), 2000), 0);
    }

    #[test]
    fn batch_script_runs_the_container_as_the_owner_with_slurms_gpus() {
        let j = job("name: t\nimage: reg/img:1\ncommand: [python, train.py, \"it's\"]\ngpus: 2\nmemory: 1GiB\nenv: {A: b, CUDA_VISIBLE_DEVICES: '5'}\n");
        let mut s = sub(&j);
        s.mounts = vec![crate::access::ResolvedMount { host: "/data/x y".into(), container: "/data".into(), read_only: true }];
        let d = batch_script(&s, 7, 1, Runtime::Docker);
        for want in [
            "docker run --name \"$name\" --init",
            "--user 1001:1001",
            "--cap-drop ALL",
            "set -- --gpus \"\\\"device=$gpus\\\"\"",
            "-e CUDA_VISIBLE_DEVICES=\"$visible\"",
            "--memory 1073741824",
            "--mount 'type=bind,source=/data/x y,target=/data,readonly'",
            "-e 'A=b'",
            "-e 'GANTRY_JOB_ID=7'",
            "'reg/img:1' \\\n  'python' \\\n  'train.py' \\\n  'it'\\''s'",
            "trap 'docker stop",
            "docker rm -f \"$name\"",
        ] {
            assert!(d.contains(want), "docker script lacks {want:?}:\n{d}");
        }
        assert!(!d.contains("CUDA_VISIBLE_DEVICES=5"), "the spec must not pick the GPUs:\n{d}");
        let a = batch_script(&s, 7, 1, Runtime::Apptainer);
        assert!(a.contains("apptainer exec --nv") && a.contains("'docker://reg/img:1'") && a.contains("--bind '/data/x y:/data:ro'"), "{a}");
    }

    #[test]
    fn slurm_states_to_gantry_table() {
        use How::*;
        // (state, reason, exit, started, stopped by gantry, expected)
        let rows: Vec<(&str, &str, Option<i64>, bool, Option<Stop>, Seen)> = vec![
            ("PENDING", "Resources", None, false, None, Seen::Pending("waiting for GPUs, CPUs or memory to free up in Slurm (Resources)".into())),
            ("PENDING", "Priority", None, false, None, Seen::Pending("other jobs come first in Slurm's order (Priority)".into())),
            ("PENDING", "QOSMaxGRESPerUser", None, false, None, Seen::Pending("you already hold the most GPUs your QOS allows per user (QOSMaxGRESPerUser)".into())),
            ("PENDING", "Licenses", None, false, None, Seen::Pending("waiting in Slurm (Licenses)".into())),
            ("RUNNING", "None", None, true, None, Seen::Running),
            ("COMPLETING", "None", None, true, None, Seen::Running),
            ("COMPLETED", "None", Some(0), true, None, Seen::Ended(Exited { code: 0, oom: false })),
            ("FAILED", "NonZeroExitCode", Some(3), true, None, Seen::Ended(Exited { code: 3, oom: false })),
            ("OUT_OF_MEMORY", "OutOfMemory", Some(137), true, None, Seen::Ended(Exited { code: 137, oom: true })),
            ("TIMEOUT", "TimeLimit", Some(143), true, None, Seen::Ended(TimedOut { code: Some(143), timeout_ms: 60_000 })),
            ("CANCELLED", "None", Some(143), true, Some(Stop::Timeout), Seen::Ended(TimedOut { code: Some(143), timeout_ms: 60_000 })),
            ("CANCELLED", "None", Some(143), true, Some(Stop::Cancel), Seen::Ended(Cancelled { code: Some(143) })),
            ("CANCELLED", "None", None, false, Some(Stop::Cancel), Seen::Ended(CancelledBeforeStart)),
            ("CANCELLED", "DependencyNeverSatisfied", None, false, None, Seen::Ended(Refused("a job it runs after did not succeed, so Slurm cancelled it".into()))),
            ("NODE_FAIL", "None", None, true, None, Seen::Ended(Lost("Slurm ended it: NODE_FAIL".into()))),
        ];
        for (state, reason, exit, started, stop, want) in rows {
            assert_eq!(seen(state, reason, exit, started, stop, Some(60_000)), want, "{state} {reason}");
        }
    }

    #[test]
    fn an_oom_kill_is_told_by_the_scripts_last_line() {
        let oom = format!("out\n{OOM_LINE}\n");
        assert_eq!(oom_from_output(How::Exited { code: 137, oom: false }, oom.as_bytes()), How::Exited { code: 137, oom: true });
        assert_eq!(oom_from_output(How::Exited { code: 137, oom: false }, b"killed\n"), How::Exited { code: 137, oom: false });
        assert_eq!(oom_from_output(How::Exited { code: 1, oom: false }, oom.as_bytes()), How::Exited { code: 1, oom: false });
    }

    #[test]
    fn a_matrix_is_one_array_whose_tasks_are_found_by_task_id() {
        let (a, b) = (job("name: s[lr=1]\nimage: a\ncommand: echo 1\n"), job("name: s[lr=2]\nimage: a\ncommand: echo 2\n"));
        let script = array_script(&[(0, sub(&a), 7), (1, sub(&b), 8)], "gantry:db:array:g", Runtime::Docker);
        assert!(script.contains("case \"${SLURM_ARRAY_TASK_ID:-}\" in\n0)\n") && script.contains("'GANTRY_JOB_ID=8'") && script.contains("'echo 2'"), "{script}");
        assert_eq!(array_arg(&[0, 2, 5]), "--array=0,2,5");
        assert_eq!(task_list("2,5"), vec![2, 5]);
        assert_eq!(task_list("1-3%2"), vec![1, 2, 3]);
        assert_eq!(task_list("0-6:3"), vec![0, 3, 6]);
        let sq = br#"{"jobs":[{"job_id":57,"job_state":"RUNNING","array_job_id":56,"array_task_id":0,"array_task_string":""},
            {"job_id":56,"job_state":"PENDING","state_reason":"Resources","array_job_id":56,"array_task_id":null,"array_task_string":"2,5"}]}"#;
        let jobs: HashMap<u64, SqJob> = parse_squeue(sq).unwrap().into_iter().map(|j| (j.job_id, j)).collect();
        assert_eq!(find_job(&jobs, 56, Some(0)).map(|j| j.job_id), Some(57));
        assert_eq!(find_job(&jobs, 56, Some(5)).map(|j| j.state()), Some("PENDING".into()));
        assert_eq!(find_job(&jobs, 56, Some(3)), None);
        assert_eq!(find_job(&jobs, 57, None).map(|j| j.job_id), Some(57));
        let log = "JobId=58 UserId=t(1) Name=wrap JobState=FAILED StartTime=2026-11-30T16:14:11 ArrayJobId=56 ArrayTaskId=2 DerivedExitCode=0:0 ExitCode=4:0 \n";
        assert_eq!(parse_jobcomp_of(log, 56, Some(2), 1).map(|c| (c.state, c.exit)), Some(("FAILED".into(), Some(4))));
        assert_eq!(parse_jobcomp_of(log, 56, Some(0), 1), None);
    }

    #[test]
    fn restart_reconciliation_table() {
        // (recorded id, jobs found by marker, action)
        let rows = [(Some(5), vec![], Resume::Follow(5)), (Some(5), vec![5], Resume::Follow(5)), (None, vec![9], Resume::Adopt(9)), (None, vec![], Resume::NeverSubmitted)];
        for (rec, found, want) in rows {
            assert_eq!(resume(rec, &found), want, "{rec:?} {found:?}");
        }
    }

    #[test]
    fn squeue_json_of_slurm_22_05_and_later() {
        let j = br#"{"meta":{},"jobs":[{"job_id":12,"job_state":"FAILED","state_reason":"NonZeroExitCode","exit_code":768,"comment":"gantry:db:7:1","name":"t","user_name":"ann","start_time":1700000000,"gres_detail":["gpu:2(IDX:0-1)"],"extra":1},
            {"job_id":13,"job_state":["CANCELLED"],"exit_code":{"status":["SIGNALED"],"return_code":{"set":true,"number":0},"signal":{"id":{"set":true,"number":15}}},"start_time":{"set":true,"number":0}}]}"#;
        let jobs = parse_squeue(j).unwrap();
        assert_eq!((jobs[0].state(), jobs[0].exit(), jobs[0].gpu_indexes(), jobs[0].started_at_s()), ("FAILED".into(), Some(3), vec![0, 1], Some(1700000000)));
        assert_eq!((jobs[1].state(), jobs[1].exit(), jobs[1].started_at_s()), ("CANCELLED".into(), Some(143), None));
        assert_eq!(decode_wait_status(9), 137);
        assert_eq!(gpu_indexes("gpu:a100:3(IDX:0,2-3)"), vec![0, 2, 3]);
    }

    #[test]
    fn jobcomp_and_node_records_are_read_by_key() {
        let log = "JobId=1 UserId=ann(1001) GroupId=ann(1001) Name=my job JobState=FAILED Partition=gpu TimeLimit=1 StartTime=2026-11-30T15:28:47 ExitCode=3:0 \n\
                   JobId=2 UserId=ann(1001) Name=x JobState=CANCELLED StartTime=Unknown ExitCode=0:15 \n";
        assert_eq!(parse_jobcomp(log, 1, 1001), Some(Completed { job_id: 1, state: "FAILED".into(), exit: Some(3), started: true }));
        assert_eq!(parse_jobcomp(log, 2, 1001), Some(Completed { job_id: 2, state: "CANCELLED".into(), exit: Some(143), started: false }));
        assert_eq!(parse_jobcomp(log, 3, 1001), None);
        let nodes = parse_nodes("NodeName=vm Arch=x86_64 CoresPerSocket=8 Gres=gpu:4 GresUsed=gpu:2(IDX:0-1) State=MIXED ThreadsPerCore=1\nNodeName=n2 Gres=gpu:h100:8(S:0-1) GresUsed=gpu:h100:0(IDX:N/A) State=IDLE\n");
        assert_eq!(nodes[0], Node { name: "vm".into(), state: "MIXED".into(), gpus: 4, gpu_type: None, gpus_used: vec![0, 1] });
        assert_eq!((nodes[1].gpus, nodes[1].gpu_type.as_deref(), nodes[1].gpus_used.len()), (8, Some("h100"), 0));
    }

    #[test]
    fn a_hostile_job_name_in_squeue_does_not_break_tracking() {
        // Slurm passes a name's bytes through unescaped: `sbatch --job-name=$'a\xffb'` by any user.
        let mut j = br#"{"jobs":[{"job_id":1,"job_state":"RUNNING","name":"a"#.to_vec();
        j.push(0xff);
        j.extend_from_slice(br#"b","comment":"x","user_id":1007},{"job_id":2,"job_state":"PENDING","comment":"gantry:db:7:1","user_id":1001}]}"#);
        let jobs = parse_squeue(&j).expect("one user's job name must not stop Gantry reading squeue");
        assert_eq!(jobs.iter().map(|j| j.job_id).collect::<Vec<_>>(), vec![1, 2]);
    }

    #[test]
    fn only_the_owners_slurm_jobs_carry_a_marker() {
        // (jobs in squeue, marker, owner uid, ids found): another user may put Gantry's marker in the
        // comment of their own Slurm job; it is never adopted as the owner's attempt.
        let sq = br#"{"jobs":[{"job_id":30,"job_state":"PENDING","comment":"gantry:db:7:1","user_id":1002},
            {"job_id":31,"job_state":"PENDING","comment":"gantry:db:7:1","user_id":1001},
            {"job_id":40,"job_state":"PENDING","comment":"gantry:db:array:g","user_id":1002,"array_job_id":40,"array_task_id":null},
            {"job_id":41,"job_state":"PENDING","comment":"gantry:db:7:2","user_id":1002}]}"#;
        let jobs = parse_squeue(sq).unwrap();
        let rows: Vec<(&str, u32, Vec<u64>)> = vec![("gantry:db:7:1", 1001, vec![31]), ("gantry:db:7:2", 1001, vec![]), ("gantry:db:array:g", 1001, vec![]), ("gantry:db:array:g", 1002, vec![40])];
        for (m, uid, want) in rows {
            assert_eq!(marked(&jobs, m, uid), want, "{m} for {uid}");
        }
    }

    #[test]
    fn another_users_jobcomp_record_is_never_taken_for_the_owners() {
        // A name may hold spaces and newlines: user b (1002) forges `JobId=7 ...` lines and array fields.
        let real = "JobId=7 UserId=ann(1001) GroupId=ann(1001) Name=t JobState=FAILED StartTime=2026-11-30T16:39:45 ExitCode=3:0 \n";
        let forged_line = "JobId=9 UserId=b(1002) GroupId=b(1002) Name=x\nJobId=7 UserId=ann(1001) Name=t JobState=COMPLETED StartTime=2026-11-30T16:39:45 ExitCode=0:0 \nJobState=CANCELLED ExitCode=0:0 \n";
        let forged_fields = "JobId=9 UserId=b(1002) GroupId=b(1002) Name=x ArrayJobId=56 ArrayTaskId=2 JobState=COMPLETED StartTime=2026-11-30T16:39:45 ExitCode=0:0 \n";
        let task = "JobId=58 UserId=ann(1001) Name=s JobState=FAILED StartTime=2026-11-30T16:14:11 ArrayJobId=56 ArrayTaskId=2 DerivedExitCode=0:0 ExitCode=4:0 \n";
        // (log, job, task, owner uid, state found)
        let rows: Vec<(String, u64, Option<u32>, u32, Option<&str>)> = vec![
            (real.into(), 7, None, 1001, Some("FAILED")),
            (real.into(), 7, None, 1002, None),
            (format!("{real}{forged_line}"), 7, None, 1001, None),
            (forged_fields.into(), 56, Some(2), 1001, None),
            (format!("{task}{forged_fields}"), 56, Some(2), 1001, Some("FAILED")),
        ];
        for (log, id, t, uid, want) in rows {
            assert_eq!(parse_jobcomp_of(&log, id, t, uid).map(|c| c.state), want.map(String::from), "{log:?} {id} {t:?} {uid}");
        }
    }

    #[test]
    fn output_is_read_only_from_a_plain_file_the_owner_owns() {
        let d = tempfile::tempdir().unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let gid = nix::unistd::getegid().as_raw();
        let u = user_log_dir(d.path(), me, gid).unwrap();
        std::fs::write(u.join("a.out"), "hello\nworld\n").unwrap();
        assert_eq!(read_output(d.path(), me, "a.out", 6).unwrap(), b"world\n");
        std::fs::write(d.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(d.path().join("secret"), u.join("b.out")).unwrap();
        assert!(read_output(d.path(), me, "b.out", 0).is_err(), "a symlink is never followed");
    }
}
