//! Why a job waits: the reasons `gantry ls` and the app show, summarized per job.

#[allow(unused_imports)]
use super::*;

pub(super) fn push_wait(out: &mut Plan, job_id: i64, reason: String, reserved: Vec<u32>) {
    let position = out.waiting.len() + 1;
    out.waiting.push(Waiting {
        job_id,
        position,
        reason,
        reserved,
    });
}

pub(super) fn list(g: &[u32]) -> String {
    g.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

/// "GPU 0 held by job 1; GPU 1 held by job 1" -> "GPUs 0,1 held by job 1".
pub(super) fn summarize(reasons: &[String]) -> String {
    let mut groups: Vec<(String, Vec<String>)> = vec![];
    for r in reasons {
        let (gpu, rest) = r
            .strip_prefix("GPU ")
            .and_then(|x| x.split_once(' '))
            .unwrap_or(("", r));
        match groups.iter_mut().find(|(k, _)| k == rest) {
            Some((_, g)) => g.push(gpu.to_string()),
            None => groups.push((rest.to_string(), vec![gpu.to_string()])),
        }
    }
    groups
        .into_iter()
        .map(|(rest, g)| {
            if g.len() == 1 {
                format!("GPU {} {rest}", g[0])
            } else {
                format!("GPUs {} {rest}", g.join(","))
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

pub(super) fn list_i64(v: &[i64]) -> String {
    v.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}
