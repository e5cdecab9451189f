//! How an attempt ended -> what the job becomes. Pure: tested by a table. Backend-neutral: the
//! engine and both backends (Docker, Slurm) speak it.

use crate::store::{EndReason, Ending, JobState};
use crate::units::duration_ms;

/// Why Gantry stopped an attempt itself (whichever backend runs it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Its owner (or an admin) cancelled it.
    Cancel,
    /// Its `timeout` passed.
    Timeout,
    /// The scheduler preempted it for another job: its checkpoint signal, its grace, then stopped,
    /// and queued again at its place.
    Preempt,
    /// It used more GPU memory than it declared, past the lab's margin and grace (the reason is in
    /// its `RunHandle`).
    GpuMemory,
}

/// How an attempt ended, as the supervisor or recovery saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum How {
    /// The container exited on its own.
    Exited {
        code: i64,
        oom: bool,
    },
    /// It exited while the engine was down; recovery found its real exit code.
    ExitedWhileAway {
        code: i64,
        oom: bool,
    },
    /// Stopped by Gantry at the job's timeout.
    TimedOut {
        code: Option<i64>,
        timeout_ms: i64,
    },
    /// Stopped on its owner's request.
    Cancelled {
        code: Option<i64>,
    },
    /// Preempted (`Stop::Preempt`): `by` says for which job and why.
    Preempted {
        code: Option<i64>,
        by: String,
    },
    CancelledBeforeStart,
    /// Its container vanished or cannot be read.
    Lost(String),
    /// The engine stopped between claiming the job and starting its container: it never ran.
    NeverStarted,
    /// The container could not be created or started.
    StartFailed {
        message: String,
        transient: bool,
    },
    /// Refused at launch (e.g. a mount the owner can no longer read): retrying cannot help.
    Refused(String),
    /// The engine's supervisor of this attempt crashed; the container was stopped.
    EngineFault(String),
    /// Stopped by Gantry: it used more GPU memory than its `gpu_memory` on a shared GPU (`message`).
    GpuMemoryExceeded {
        code: Option<i64>,
        message: String,
    },
}

/// What the outcome depends on besides `How`.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub retries: u32,
    /// This attempt's number (1-based).
    pub attempt_n: u32,
    pub backoff_ms: i64,
    pub backoff_max_ms: i64,
    pub transient_retry_ms: i64,
    pub now_ms: i64,
}

pub fn outcome(how: &How, p: &RetryPolicy) -> Ending {
    let end = |code, reason, message: String, next| Ending {
        exit_code: code,
        reason,
        message: Some(message),
        next,
        not_before: None,
    };
    // A failure: retry with exponential backoff while retries remain (never after cancel or timeout).
    let failure = |code: Option<i64>, reason: EndReason, what: String| {
        if p.attempt_n <= p.retries {
            let delay = (p
                .backoff_ms
                .saturating_mul(1i64 << (p.attempt_n.saturating_sub(1)).min(20)))
            .min(p.backoff_max_ms);
            Ending {
                exit_code: code,
                reason,
                message: Some(format!(
                    "{what}; retry {} of {} in {}",
                    p.attempt_n,
                    p.retries,
                    duration_ms(delay)
                )),
                next: JobState::Queued,
                not_before: Some(p.now_ms + delay),
            }
        } else {
            end(code, reason, what, JobState::Failed)
        }
    };
    match how {
        How::Exited { code: 0, oom: false } => Ending {
            exit_code: Some(0),
            reason: EndReason::Exited,
            message: None,
            next: JobState::Succeeded,
            not_before: None,
        },
        How::ExitedWhileAway { code: 0, oom: false } => end(
            Some(0),
            EndReason::Exited,
            "exited with code 0 while the engine was down".into(),
            JobState::Succeeded,
        ),
        How::Exited { code, oom: true } => failure(
            Some(*code),
            EndReason::Oom,
            format!("killed: out of memory (code {code})"),
        ),
        How::Exited { code, oom: false } => failure(Some(*code), EndReason::Exited, format!("exited with code {code}")),
        How::ExitedWhileAway { code, oom } => failure(
            Some(*code),
            if *oom { EndReason::Oom } else { EndReason::Exited },
            format!(
                "exited with code {code}{} while the engine was down",
                if *oom { " (out of memory)" } else { "" }
            ),
        ),
        // Never retried: a job that ran out of time would most likely run out of it again.
        How::TimedOut { code, timeout_ms } => {
            let not_retried = if p.retries > 0 {
                "; not retried (`retries` apply to failures, not to a timeout)"
            } else {
                ""
            };
            end(
                *code,
                EndReason::Timeout,
                format!("stopped after the {} timeout{not_retried}", duration_ms(*timeout_ms)),
                JobState::TimedOut,
            )
        }
        How::Cancelled { code } => end(*code, EndReason::Cancelled, "cancelled".into(), JobState::Cancelled),
        // Back to its place in the queue at once; not a failure, so its retries are untouched
        // (`attempt_n` counts only attempts that did not end by preemption).
        How::Preempted { code, by } => end(
            *code,
            EndReason::Preempted,
            format!("preempted by {by} · resumes when GPUs free"),
            JobState::Queued,
        ),
        // Not retried: it would break its neighbours again.
        How::GpuMemoryExceeded { code, message } => end(*code, EndReason::Oom, message.clone(), JobState::Failed),
        How::CancelledBeforeStart => end(
            None,
            EndReason::Cancelled,
            "cancelled before it started".into(),
            JobState::Cancelled,
        ),
        How::Lost(why) => failure(None, EndReason::Lost, why.clone()),
        How::NeverStarted => end(
            None,
            EndReason::Lost,
            "the engine stopped before the container started; queued again".into(),
            JobState::Queued,
        ),
        How::StartFailed {
            message,
            transient: true,
        } => Ending {
            exit_code: None,
            reason: EndReason::EngineError,
            message: Some(message.clone()),
            next: JobState::Queued,
            not_before: Some(p.now_ms + p.transient_retry_ms),
        },
        How::StartFailed {
            message,
            transient: false,
        }
        | How::Refused(message) => end(None, EndReason::EngineError, message.clone(), JobState::Failed),
        How::EngineFault(why) => failure(
            None,
            EndReason::EngineError,
            format!("the engine's supervisor of this attempt crashed ({why}); the container was stopped"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_table() {
        let p = |n, retries| RetryPolicy {
            retries,
            attempt_n: n,
            backoff_ms: 10_000,
            backoff_max_ms: 600_000,
            transient_retry_ms: 5_000,
            now_ms: 1_000_000,
        };
        use JobState::*;
        // (how, policy, next state, exit code, reason, not_before, message contains)
        #[allow(clippy::type_complexity)] // a table test: one tuple per case reads as the table
        let rows: Vec<(How, RetryPolicy, JobState, Option<i64>, EndReason, Option<i64>, &str)> = vec![
            (
                How::Exited { code: 0, oom: false },
                p(1, 0),
                Succeeded,
                Some(0),
                EndReason::Exited,
                None,
                "",
            ),
            (
                How::Exited { code: 3, oom: false },
                p(1, 0),
                Failed,
                Some(3),
                EndReason::Exited,
                None,
                "exited with code 3",
            ),
            (
                How::Exited { code: 3, oom: false },
                p(1, 2),
                Queued,
                Some(3),
                EndReason::Exited,
                Some(1_010_000),
                "retry 1 of 2 in 10s",
            ),
            (
                How::Exited { code: 3, oom: false },
                p(2, 2),
                Queued,
                Some(3),
                EndReason::Exited,
                Some(1_020_000),
                "retry 2 of 2 in 20s",
            ),
            (
                How::Exited { code: 3, oom: false },
                p(3, 2),
                Failed,
                Some(3),
                EndReason::Exited,
                None,
                "exited with code 3",
            ),
            // Backoff is capped.
            (
                How::Exited { code: 1, oom: false },
                p(9, 20),
                Queued,
                Some(1),
                EndReason::Exited,
                Some(1_600_000),
                "in 10m",
            ),
            (
                How::Exited { code: 137, oom: true },
                p(1, 0),
                Failed,
                Some(137),
                EndReason::Oom,
                None,
                "out of memory",
            ),
            (
                How::ExitedWhileAway { code: 0, oom: false },
                p(1, 0),
                Succeeded,
                Some(0),
                EndReason::Exited,
                None,
                "while the engine was down",
            ),
            (
                How::ExitedWhileAway { code: 2, oom: false },
                p(1, 1),
                Queued,
                Some(2),
                EndReason::Exited,
                Some(1_010_000),
                "while the engine was down",
            ),
            // Timeouts and cancels never retry.
            (
                How::TimedOut {
                    code: Some(143),
                    timeout_ms: 60_000,
                },
                p(1, 5),
                TimedOut,
                Some(143),
                EndReason::Timeout,
                None,
                "after the 1m timeout",
            ),
            (
                How::TimedOut {
                    code: Some(137),
                    timeout_ms: 60_000,
                },
                p(2, 5),
                TimedOut,
                Some(137),
                EndReason::Timeout,
                None,
                "after the 1m timeout; not retried (`retries` apply to failures",
            ),
            (
                How::TimedOut {
                    code: Some(143),
                    timeout_ms: 60_000,
                },
                p(1, 0),
                TimedOut,
                Some(143),
                EndReason::Timeout,
                None,
                "after the 1m timeout",
            ),
            (
                How::Cancelled { code: Some(143) },
                p(1, 5),
                Cancelled,
                Some(143),
                EndReason::Cancelled,
                None,
                "cancelled",
            ),
            (
                How::CancelledBeforeStart,
                p(1, 5),
                Cancelled,
                None,
                EndReason::Cancelled,
                None,
                "before it started",
            ),
            // Preempted: queued again at once, whatever the retries (0 left, or some), never failed.
            (
                How::Preempted {
                    code: Some(0),
                    by: "job 41 (alice's 4-GPU job waited 3h)".into(),
                },
                p(1, 0),
                Queued,
                Some(0),
                EndReason::Preempted,
                None,
                "preempted by job 41 (alice's 4-GPU job waited 3h) · resumes when GPUs free",
            ),
            (
                How::Preempted {
                    code: Some(143),
                    by: "job 2".into(),
                },
                p(3, 2),
                Queued,
                Some(143),
                EndReason::Preempted,
                None,
                "preempted by job 2",
            ),
            (
                How::Lost("its container is gone".into()),
                p(1, 1),
                Queued,
                None,
                EndReason::Lost,
                Some(1_010_000),
                "its container is gone",
            ),
            (
                How::Lost("its container is gone".into()),
                p(1, 0),
                Failed,
                None,
                EndReason::Lost,
                None,
                "its container is gone",
            ),
            // It never ran: queued again at once, whatever the retries.
            (
                How::NeverStarted,
                p(1, 0),
                Queued,
                None,
                EndReason::Lost,
                None,
                "queued again",
            ),
            (
                How::StartFailed {
                    message: "Docker away".into(),
                    transient: true,
                },
                p(1, 0),
                Queued,
                None,
                EndReason::EngineError,
                Some(1_005_000),
                "Docker away",
            ),
            (
                How::StartFailed {
                    message: "no image".into(),
                    transient: false,
                },
                p(1, 3),
                Failed,
                None,
                EndReason::EngineError,
                None,
                "no image",
            ),
            (
                How::Refused("cannot read /data".into()),
                p(1, 3),
                Failed,
                None,
                EndReason::EngineError,
                None,
                "cannot read /data",
            ),
            (
                How::EngineFault("bug".into()),
                p(1, 0),
                Failed,
                None,
                EndReason::EngineError,
                None,
                "supervisor of this attempt crashed",
            ),
        ];
        for (how, pol, next, code, reason, not_before, msg) in rows {
            let e = outcome(&how, &pol);
            assert_eq!(
                (e.next, e.exit_code, e.reason, e.not_before),
                (next, code, reason, not_before),
                "{how:?} attempt {}",
                pol.attempt_n
            );
            assert!(
                e.message.clone().unwrap_or_default().contains(msg),
                "{how:?}: {:?} lacks {msg:?}",
                e.message
            );
        }
    }
}
