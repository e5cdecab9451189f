//! The tools that read more than one answer: a log's last or matching lines (streamed, never held
//! whole), a failed job's triage, and a comparison of runs.

use std::collections::{BTreeMap, VecDeque};

use gantry_core::client::{Client, ClientError};
use gantry_core::protocol::{EndReason, JobDetailView, JobState};
use serde_json::Value;

use super::types::{CompareItem, CompareOut, TriageOut};
use super::{end_reason, err, runtime_s};

/// A line longer than this is cut (a progress bar without newlines, a dumped tensor).
const LINE_CHARS: usize = 1000;
/// Lines a triage shows: the ones that look like the error, and the last ones.
const TRIAGE_MATCHES: usize = 30;
const TRIAGE_TAIL: usize = 20;
/// What marks a line as part of an error, lowercased.
const ERROR_MARKS: [&str; 12] = [
    "error",
    "traceback",
    "exception",
    "out of memory",
    "killed",
    "cuda",
    "nccl",
    "segmentation fault",
    "assert",
    "panicked",
    "not found",
    "permission denied",
];

/// The lines of a streamed log, one at a time: a carriage return keeps what follows it (a
/// progress bar's last state), a long line is cut.
struct Lines {
    partial: Vec<u8>,
}

impl Lines {
    fn feed(&mut self, chunk: &[u8], mut each: impl FnMut(String)) {
        for b in chunk {
            match b {
                b'\n' => each(self.take()),
                b'\r' => self.partial.clear(),
                _ if self.partial.len() < LINE_CHARS * 4 => self.partial.push(*b),
                _ => {}
            }
        }
    }
    fn take(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.partial);
        let s: String = s
            .chars()
            .filter(|c| !c.is_control() || *c == '\t')
            .take(LINE_CHARS)
            .collect();
        self.partial.clear();
        s
    }
    fn finish(mut self, each: impl FnMut(String)) {
        if !self.partial.is_empty() {
            let mut each = each;
            each(self.take());
        }
    }
}

/// The last `tail` lines of job `id`'s log (those containing `pattern`, any case, when given), and
/// how many lines there were (that matched).
pub async fn log_lines(
    client: &Client,
    id: i64,
    tail: usize,
    pattern: Option<&str>,
) -> Result<(Vec<String>, usize), ClientError> {
    let needle = pattern.map(|p| p.to_lowercase()).filter(|p| !p.is_empty());
    let mut kept: VecDeque<String> = VecDeque::new();
    let mut total = 0usize;
    let mut keep = |line: String| {
        if needle.as_ref().is_some_and(|n| !line.to_lowercase().contains(n)) {
            return;
        }
        total += 1;
        if kept.len() == tail {
            kept.pop_front();
        }
        kept.push_back(line);
    };
    let mut lines = Lines { partial: vec![] };
    client
        .logs_chunks(id, |chunk| {
            lines.feed(chunk, &mut keep);
            true
        })
        .await?;
    lines.finish(&mut keep);
    Ok((kept.into_iter().collect(), total))
}

/// The lines that look like the error (at most [`TRIAGE_MATCHES`], the last ones), then the last
/// [`TRIAGE_TAIL`] lines not already among them.
async fn relevant_lines(client: &Client, id: i64) -> Result<Vec<String>, ClientError> {
    let mut marked: VecDeque<(usize, String)> = VecDeque::new();
    let mut last: VecDeque<(usize, String)> = VecDeque::new();
    let mut n = 0usize;
    let mut keep = |line: String| {
        n += 1;
        let low = line.to_lowercase();
        if ERROR_MARKS.iter().any(|m| low.contains(m)) {
            if marked.len() == TRIAGE_MATCHES {
                marked.pop_front();
            }
            marked.push_back((n, line.clone()));
        }
        if last.len() == TRIAGE_TAIL {
            last.pop_front();
        }
        last.push_back((n, line));
    };
    let mut lines = Lines { partial: vec![] };
    client
        .logs_chunks(id, |chunk| {
            lines.feed(chunk, &mut keep);
            true
        })
        .await?;
    lines.finish(&mut keep);
    let mut out: BTreeMap<usize, String> = marked.into_iter().collect();
    out.extend(last);
    Ok(out.into_values().collect())
}

/// What to change, from how it ended and what its log says.
fn advice(d: &JobDetailView, reason: Option<EndReason>, lines: &[String]) -> Vec<String> {
    let j = &d.job;
    let log = lines.join("\n").to_lowercase();
    let mut out = vec![];
    let cuda_oom = log.contains("cuda out of memory") || log.contains("cuda error: out of memory");
    match (j.state, reason) {
        (JobState::Queued | JobState::Starting | JobState::Running, _) => out.push(format!(
            "job {} has not ended ({}): see why_waiting, or read_log while it runs",
            j.id,
            j.state.as_str()
        )),
        (JobState::Succeeded, _) => out.push("it succeeded: nothing to fix".into()),
        (_, Some(EndReason::Oom)) => out.push(
            "it ran out of RAM (its container's memory limit, not GPU memory): raise `memory:` in the spec \
             (within the lab's share), or use fewer DataLoader workers / a smaller in-memory dataset"
                .into(),
        ),
        (_, Some(EndReason::Timeout)) | (JobState::TimedOut, _) => out.push(format!(
            "it reached its timeout ({}): raise `timeout:` (the lab's maximum applies), or save checkpoints and \
             resume from them; set `expected_runtime` so the scheduler plans for it",
            j.timeout_ms
                .map(gantry_core::units::duration_ms)
                .unwrap_or_else(|| "unset".into())
        )),
        (_, Some(EndReason::Lost)) => out.push(
            "the engine lost its container (a machine or Docker restart): nothing in the job needs changing; \
             rerun_job runs it again"
                .into(),
        ),
        (_, Some(EndReason::Preempted)) => out.push(
            "it was preempted for another job and queued again: nothing to fix; make sure it saves a checkpoint on \
             its checkpoint signal and resumes from it"
                .into(),
        ),
        (_, Some(EndReason::EngineError)) => out.push(
            "the engine could not run it (see `message`: an image that cannot be pulled, a mount, a device): fix \
             the spec, preview_submit it, then submit_job"
                .into(),
        ),
        (JobState::Cancelled, _) | (_, Some(EndReason::Cancelled)) => {
            out.push("it was cancelled (by its owner or an admin): rerun_job if it is still wanted".into())
        }
        (_, _) => match j.exit_code {
            Some(137) => out.push(
                "exit code 137: it was killed (SIGKILL), usually for memory: raise `memory:`, or look for a \
                 process that ran away"
                    .into(),
            ),
            Some(139) => {
                out.push("exit code 139: a segmentation fault in native code (a CUDA or library mismatch?)".into())
            }
            Some(127) => out.push(
                "exit code 127: the command was not found in the image: check `command:` and `image:` (is the \
                 program on PATH there?)"
                    .into(),
            ),
            Some(126) => out.push("exit code 126: the command is not executable: check its mode and `command:`".into()),
            Some(c) => out.push(format!(
                "exit code {c}: the program failed; its error is in log_lines: fix the code or its inputs, \
                 preview_submit the changed spec, then submit_job (rerun_job repeats the same spec)"
            )),
            None => out.push("it failed without an exit code: see `message` and log_lines".into()),
        },
    }
    if cuda_oom {
        out.push(
            "the log says CUDA ran out of GPU memory: lower the batch size or use mixed precision; if it shares a GPU \
             (`gpu_memory:`), ask for more, or for a whole GPU (leave `gpu_memory` out) or a larger one \
             (`min_gpu_memory:`)"
                .into(),
        );
    }
    if log.contains("no such file or directory") || log.contains("permission denied") {
        out.push("the log names a missing or unreadable path: check `mounts:` (host:container) and `workdir:`".into());
    }
    out
}

pub async fn triage(client: &Client, id: i64) -> Result<TriageOut, String> {
    let d = client.job(id).await.map_err(err)?;
    let reason = d.attempts.last().and_then(|a| a.reason);
    // A job that never started has no log: its message says why.
    let log_lines = match relevant_lines(client, id).await {
        Ok(l) => l,
        Err(ClientError::Api { status: 404, .. }) => vec![],
        Err(e) => return Err(err(e)),
    };
    let message = d
        .job
        .message
        .clone()
        .or_else(|| d.attempts.last().and_then(|a| a.message.clone()));
    Ok(TriageOut {
        advice: advice(&d, reason, &log_lines),
        id,
        name: d.job.name.clone(),
        state: d.job.state.as_str().into(),
        exit_code: d.job.exit_code,
        end_reason: end_reason(&d),
        message,
        attempts: d.job.attempts,
        log_lines,
    })
}

/// The spec fields of a job as the engine shows them to the caller (empty when hidden).
fn spec_fields(d: &JobDetailView) -> serde_json::Map<String, Value> {
    d.job
        .job
        .as_ref()
        .and_then(|j| serde_json::to_value(&j.spec).ok())
        .and_then(|v| v.as_object().cloned())
        .unwrap_or_default()
}

pub async fn compare(client: &Client, ids: &[i64]) -> Result<CompareOut, String> {
    if ids.len() < 2 {
        return Err("give two or more job ids to compare".into());
    }
    if ids.len() > 50 {
        return Err("compare at most 50 jobs at once".into());
    }
    let mut details = vec![];
    for id in ids {
        details.push(client.job(*id).await.map_err(err)?);
    }
    // The engine's comparison of their run results (params, last and best per metric), where it has one.
    let results = client
        .compare(&gantry_core::protocol::CompareQuery {
            ids: Some(ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")),
            ..Default::default()
        })
        .await
        .ok();
    let specs: Vec<_> = details.iter().map(spec_fields).collect();
    let mut keys: Vec<&String> = specs.iter().flat_map(|s| s.keys()).collect();
    keys.sort();
    keys.dedup();
    let differences: Vec<String> = keys
        .into_iter()
        .filter(|k| specs.iter().any(|s| s.get(*k) != specs[0].get(*k)))
        .cloned()
        .collect();
    let jobs = details
        .iter()
        .zip(&specs)
        .map(|(d, s)| {
            let fields: serde_json::Map<String, Value> = differences
                .iter()
                .map(|k| (k.clone(), s.get(k).cloned().unwrap_or(Value::Null)))
                .collect();
            let row = results
                .as_ref()
                .and_then(|c| c.rows.iter().find(|r| r.job_id == d.job.id && !r.hidden));
            CompareItem {
                id: d.job.id,
                name: d.job.name.clone(),
                state: d.job.state.as_str().into(),
                exit_code: d.job.exit_code,
                runtime_s: runtime_s(d.job.started_at, d.job.finished_at),
                fields: fields.into(),
                results: row.and_then(|r| serde_json::to_value(r).ok()),
            }
        })
        .collect();
    Ok(CompareOut { jobs, differences })
}
