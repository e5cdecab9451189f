//! What Slurm says -> what Gantry makes of it: `squeue --json`, the jobcomp log, nodes, and the
//! decisions on them (pure; tested by tables).

use std::collections::HashMap;

use serde::Deserialize;

use super::{SlurmError, OOM_LINE};
use crate::outcome::How;
pub use crate::outcome::Stop;

/// Where Slurm's view of an attempt is: its own job, or its task of an array (a task not started
/// yet shows in the array's pending record, whose `array_task_string` lists it).
pub fn find_job(jobs: &HashMap<u64, SqJob>, id: u64, task: Option<u32>) -> Option<&SqJob> {
    let Some(t) = task else { return jobs.get(&id) };
    jobs.values()
        .find(|j| number(&j.array_job_id) == Some(id as i64) && number(&j.array_task_id) == Some(t as i64))
        .or_else(|| {
            jobs.get(&id)
                .filter(|j| number(&j.array_task_id).is_none() && task_list(&j.array_task_string).contains(&t))
        })
}

/// The ids of the Slurm jobs of user `uid` whose comment is `marker` (an array's tasks: the array's
/// id). Anyone can put any comment on their own jobs, so a job of another user is never taken.
pub fn marked(jobs: &[SqJob], marker: &str, uid: u32) -> Vec<u64> {
    jobs.iter()
        .filter(|j| j.comment.as_deref() == Some(marker) && number(&j.user_id) == Some(uid as i64))
        .map(|j| {
            number(&j.array_job_id)
                .filter(|a| *a > 0)
                .map(|a| a as u64)
                .unwrap_or(j.job_id)
        })
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
    /// How often Slurm requeued it (`scontrol requeue`, its own preemption with PreemptMode=REQUEUE,
    /// a node failure); the job sees it as `SLURM_RESTART_COUNT`.
    #[serde(default)]
    pub restart_cnt: serde_json::Value,
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
    serde_json::from_str::<SqueueOut>(&json)
        .map(|o| o.jobs)
        .map_err(|e| SlurmError::Parse(format!("squeue --json: {e}")))
}

pub fn number(v: &serde_json::Value) -> Option<i64> {
    match v {
        serde_json::Value::Number(n) => n.as_i64(),
        serde_json::Value::Object(o) => o
            .get("number")
            .and_then(|n| n.as_i64())
            .filter(|_| o.get("set").and_then(|s| s.as_bool()).unwrap_or(true)),
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
                let sig = o
                    .get("signal")
                    .and_then(|s| number(s.get("id").unwrap_or(&serde_json::Value::Null)));
                match sig.filter(|s| *s > 0) {
                    Some(s) => Some(128 + s),
                    None => o.get("return_code").and_then(number),
                }
            }
            v => number(v).map(decode_wait_status),
        }
    }

    /// `restart_cnt`, when Slurm says.
    pub fn restarts(&self) -> Option<u32> {
        number(&self.restart_cnt).map(|n| n.max(0) as u32)
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
    let Some(rest) = detail
        .strip_prefix("gpu")
        .and_then(|r| r.split_once("IDX:"))
        .map(|(_, r)| r)
    else {
        return vec![];
    };
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
pub fn seen(
    state: &str,
    reason: &str,
    exit: Option<i64>,
    started: bool,
    stopped_by_gantry: Option<Stop>,
    timeout_ms: Option<i64>,
) -> Seen {
    let code = exit;
    match state {
        "PENDING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "RESV_DEL_HOLD" | "SPECIAL_EXIT" => {
            Seen::Pending(why_waiting(reason))
        }
        "RUNNING" | "CONFIGURING" | "COMPLETING" | "SUSPENDED" | "STOPPED" | "SIGNALING" | "STAGE_OUT" | "RESIZING" => {
            Seen::Running
        }
        "COMPLETED" => Seen::Ended(How::Exited {
            code: code.unwrap_or(0),
            oom: false,
        }),
        "FAILED" => Seen::Ended(How::Exited {
            code: code.filter(|c| *c != 0).unwrap_or(1),
            oom: false,
        }),
        "OUT_OF_MEMORY" => Seen::Ended(How::Exited {
            code: code.unwrap_or(137),
            oom: true,
        }),
        "TIMEOUT" => Seen::Ended(How::TimedOut {
            code,
            timeout_ms: timeout_ms.unwrap_or(0),
        }),
        "CANCELLED" => Seen::Ended(match stopped_by_gantry {
            Some(Stop::Timeout) => How::TimedOut {
                code,
                timeout_ms: timeout_ms.unwrap_or(0),
            },
            _ if reason.starts_with("Dependency") || reason == "DependencyNeverSatisfied" => {
                How::Refused("a job it runs after did not succeed, so Slurm cancelled it".into())
            }
            _ if !started => How::CancelledBeforeStart,
            _ => How::Cancelled { code },
        }),
        // Slurm's own preemption (PreemptMode=CANCEL ends it so): recorded as preempted, queued again.
        "PREEMPTED" => Seen::Ended(How::Preempted {
            code,
            by: "Slurm (the cluster's own preemption)".into(),
        }),
        "NODE_FAIL" | "BOOT_FAIL" | "DEADLINE" | "REVOKED" => Seen::Ended(How::Lost(format!(
            "Slurm ended it: {state}{}",
            if reason.is_empty() || reason == "None" {
                String::new()
            } else {
                format!(" ({reason})")
            }
        ))),
        other => Seen::Pending(format!("in Slurm state {other}")),
    }
}

/// Whether Slurm requeued the Slurm job an attempt follows: its restart count passed the attempt's
/// `base` (the count when the attempt began following it); where Slurm shows no restart count, it is
/// back in Slurm's queue after the attempt saw it run. Then the attempt ended by preemption (Gantry's `scontrol requeue`, or Slurm's
/// own), and the job's next attempt follows the same Slurm job ([`adoptable`]).
pub fn requeued(state: &str, restarts: Option<u32>, base: u32, ran: bool) -> bool {
    match restarts {
        Some(n) => n > base,
        None => ran && matches!(state, "PENDING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED"),
    }
}

/// Whether a job's next attempt takes over the Slurm job its preempted attempt followed (instead of a
/// new `sbatch`): Slurm requeued it (`restarts` reached `base`, the attempts that followed it before)
/// and it has not ended since.
pub fn adoptable(state: &str, restarts: Option<u32>, base: u32) -> bool {
    restarts.is_none_or(|n| n >= base)
        && base > 0
        && matches!(
            seen(state, "", None, false, None, None),
            Seen::Pending(_) | Seen::Running
        )
}

/// Slurm's signal name for `--signal`/`scancel --signal`: `SIGUSR1` -> `USR1`.
pub fn slurm_signal(name: &str) -> &str {
    name.strip_prefix("SIG").unwrap_or(name)
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
            && l.split(' ')
                .nth(1)
                .is_some_and(|u| u.starts_with("UserId=") && u.ends_with(&owner))
            && if task.is_none() {
                l.starts_with(&want)
            } else {
                format!("{l} ").contains(&want)
            }
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
        if sig > 0 {
            Some(128 + sig)
        } else {
            code.parse().ok()
        }
    });
    Some(Completed {
        job_id,
        state: kv.get("JobState").cloned().unwrap_or_default(),
        exit,
        started: kv
            .get("StartTime")
            .is_some_and(|s| !s.is_empty() && s != "Unknown" && s != "None"),
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
                gpus_used: kv
                    .get("GresUsed")
                    .map(|g| g.split(',').flat_map(gpu_indexes).collect())
                    .unwrap_or_default(),
            }
        })
        .collect()
}

/// An exit with code 137 whose output ends with [`OOM_LINE`] was an OOM kill.
pub fn oom_from_output(how: How, tail: &[u8]) -> How {
    match how {
        How::Exited { code, oom: false }
            if code == 137
                && String::from_utf8_lossy(tail)
                    .lines()
                    .rev()
                    .take(3)
                    .any(|l| l.trim() == OOM_LINE) =>
        {
            How::Exited { code, oom: true }
        }
        other => other,
    }
}
