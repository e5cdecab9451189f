//! Interactive sessions (`gantry shell`, `gantry attach`): a running session's terminal, proxied
//! between its container's TTY (the backend's [`Terminal`]) and one client connection, framed as
//! [`crate::protocol::terminal`] says. Any number of connections may be attached at once; closing
//! one (detaching) leaves the session running. The session ends when its shell exits or at its
//! length (`timeout`), which the supervisor enforces like any job's; warnings are written into the
//! terminal [`SESSION_WARNINGS`] before.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::debug;

use super::{Engine, EngineError};
use crate::defaults::SESSION_WARNINGS;
use crate::executor::Terminal;
use crate::protocol::terminal::{Decoder, Frame, SessionEnd};
use crate::store::{JobState, RunRef};

/// A session someone may attach to: checked, its terminal not opened yet.
#[derive(Debug, Clone)]
pub struct Attachable {
    pub job_id: i64,
    pub run: RunRef,
    /// When its length runs out (ms), if it has one.
    pub ends_at: Option<i64>,
}

/// Why a session cannot be attached to, for the API to answer with.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("job {0} is not an interactive session (`gantry shell` starts one); follow its output with `gantry logs -f {0}`")]
    NotASession(i64),
    /// Only the owner: a session's terminal types commands as its owner (an admin may cancel it).
    #[error("session {job} belongs to {owner}; only its owner can attach to it")]
    NotOwner { job: i64, owner: String },
    /// Not running yet (queued, starting) or no more (ended): `gantry shell` waits for the first.
    #[error("session {job} is {}{}", state.as_str(), if state.is_final() { "; start another with `gantry shell`" } else { "; attach once it runs" })]
    NotRunning { job: i64, state: JobState },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Terminal connections open per uid (each holds a Docker attachment): a session is one person's,
/// a few terminals on it are plenty; a script opening thousands is refused.
const TERMINALS_PER_USER: usize = 16;

static TERMINALS: std::sync::Mutex<std::collections::BTreeMap<u32, usize>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// One open terminal connection of a uid, counted until dropped.
pub struct TerminalSlot(u32);

impl TerminalSlot {
    pub fn take(uid: u32) -> Result<TerminalSlot, String> {
        let mut open = TERMINALS.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(uid).or_default();
        if *n >= TERMINALS_PER_USER {
            return Err(format!("you have {n} terminals attached already, the most one user may; detach some (Ctrl-P Ctrl-Q) and try again"));
        }
        *n += 1;
        Ok(TerminalSlot(uid))
    }
}

impl Drop for TerminalSlot {
    fn drop(&mut self) {
        let mut open = TERMINALS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.0);
            }
        }
    }
}

/// The next warning to write into a session's terminal: when (ms) and how much time is left then,
/// the first of `warnings` (time before the end, longest first) still ahead of `now`; `None` when
/// none is (or the session has no end).
pub fn next_warning(ends_at: Option<i64>, now: i64, warnings: &[Duration]) -> Option<(i64, Duration)> {
    let end = ends_at?;
    warnings
        .iter()
        .map(|w| (end - w.as_millis() as i64, *w))
        .find(|(at, _)| *at > now)
}

/// "in 14 min (at 15:04 UTC)" and the like, for the terminal.
fn left(ms: i64) -> String {
    let mins = (ms.max(0) + 59_999) / 60_000;
    if mins >= 120 && mins % 60 == 0 {
        format!("{} h", mins / 60)
    } else if mins >= 120 {
        format!("{} h {} min", mins / 60, mins % 60)
    } else {
        format!("{mins} min")
    }
}

impl Engine {
    /// Whether `caller` may attach to job `id` now: their own session, running, with a container.
    pub fn attachable(&self, id: i64, caller: u32) -> Result<Attachable, AttachError> {
        let d = self.job_detail(id)?;
        let job = &d.job;
        if !job.job.spec.interactive {
            return Err(AttachError::NotASession(id));
        }
        if job.owner_uid != caller {
            return Err(AttachError::NotOwner {
                job: id,
                owner: job.owner.clone(),
            });
        }
        let attempt = d.attempts.last().filter(|a| a.ended_at.is_none());
        let run = self
            .running
            .lock()
            .unwrap()
            .get(&id)
            .and_then(|h| h.run.clone())
            .or_else(|| attempt.and_then(|a| a.container_id.clone()).map(RunRef::Container));
        match (job.state, attempt, run) {
            (JobState::Running, Some(a), Some(run)) => Ok(Attachable {
                job_id: id,
                run,
                ends_at: job.timeout_ms.map(|t| a.started_at + t),
            }),
            (state, _, _) => Err(AttachError::NotRunning { job: id, state }),
        }
    }

    /// Open the session's terminal (before the client's connection is upgraded, so a failure is an
    /// ordinary answer).
    pub async fn open_terminal(&self, s: &Attachable) -> Result<Terminal, EngineError> {
        self.backend.terminal(&s.run).await
    }

    /// Proxy the terminal and the client's connection until the session ends (an `Ended` frame,
    /// then close) or the client goes (detached: the session keeps running).
    pub async fn serve_terminal<IO: AsyncRead + AsyncWrite + Unpin + Send>(
        self: Arc<Self>,
        s: Attachable,
        term: Terminal,
        io: IO,
    ) {
        let Terminal { mut output, mut input } = term;
        let (mut from_client, mut to_client) = tokio::io::split(io);
        let welcome = match s.ends_at {
            Some(end) => format!(
                "attached to session {}; it ends in {} unless its shell exits first",
                s.job_id,
                left(end - self.now())
            ),
            None => format!("attached to session {}", s.job_id),
        };
        if to_client.write_all(&Frame::Notice(welcome).encode()).await.is_err() {
            return;
        }
        let mut decoder = Decoder::default();
        let mut buf = vec![0u8; 16 * 1024];
        let mut warned_for: Option<i64> = None;
        let mut notices = self.session_notices.subscribe();
        loop {
            let now = self.now();
            let warning = next_warning(s.ends_at, now, &SESSION_WARNINGS).filter(|(at, _)| Some(*at) != warned_for);
            let until_warning = warning
                .map(|(at, _)| Duration::from_millis((at - now).max(0) as u64))
                .unwrap_or(Duration::from_secs(3600));
            tokio::select! {
                out = output.next() => match out {
                    Some(Ok(bytes)) => {
                        if to_client.write_all(&Frame::Data(bytes.to_vec()).encode()).await.is_err() {
                            return; // the client went: detached
                        }
                    }
                    Some(Err(err)) => {
                        debug!(job = s.job_id, "the session's terminal ended: {err}");
                        break;
                    }
                    None => break,
                },
                read = from_client.read(&mut buf) => {
                    let n = match read {
                        Ok(0) | Err(_) => return, // detached
                        Ok(n) => n,
                    };
                    let frames = match decoder.push(&buf[..n]) {
                        Ok(f) => f,
                        Err(err) => {
                            debug!(job = s.job_id, "closing a terminal connection: {err}");
                            return;
                        }
                    };
                    for f in frames {
                        match f {
                            Frame::Data(keys) => {
                                if input.write_all(&keys).await.and(input.flush().await).is_err() {
                                    break;
                                }
                            }
                            Frame::Resize { cols, rows } => {
                                if let Err(err) = self.backend.resize_terminal(&s.run, cols, rows).await {
                                    debug!(job = s.job_id, "resizing the terminal failed: {err}");
                                }
                            }
                            // Only the engine sends these.
                            Frame::Notice(_) | Frame::Ended(_) => {}
                        }
                    }
                }
                notice = notices.recv() => {
                    // Lagged: some lines for other sessions were skipped; the sender lives as long as
                    // the engine.
                    if let Ok((job, text)) = notice {
                        if job == s.job_id && to_client.write_all(&Frame::Notice(text).encode()).await.is_err() {
                            return;
                        }
                    }
                }
                _ = tokio::time::sleep(until_warning), if warning.is_some() => {
                    let (at, before) = warning.expect("guarded");
                    warned_for = Some(at);
                    let text = format!("session {} ends in {}: save your work (`gantry shell --for` asks for a longer one next time)", s.job_id, left(before.as_millis() as i64));
                    if to_client.write_all(&Frame::Notice(text).encode()).await.is_err() {
                        return;
                    }
                }
            }
        }
        // The container ended: say how once the supervisor has recorded it.
        let end = self.wait_recorded(s.job_id).await;
        let _ = to_client.write_all(&Frame::Ended(end).encode()).await;
        let _ = to_client.shutdown().await;
    }

    /// The session's end as recorded (the supervisor records it moments after the container ends).
    async fn wait_recorded(&self, id: i64) -> SessionEnd {
        for _ in 0..600 {
            if let Ok(d) = self.job_detail(id) {
                if d.job.state.is_final() {
                    let why = d
                        .attempts
                        .last()
                        .and_then(|a| a.message.clone())
                        .or(d.job.message.clone());
                    let message = match (d.job.state, d.job.exit_code) {
                        (JobState::TimedOut, _) => "its time ran out".to_string(),
                        (JobState::Cancelled, _) => "it was cancelled".to_string(),
                        (_, Some(c)) => format!("its shell exited with status {c}"),
                        _ => why.unwrap_or_else(|| "it ended".into()),
                    };
                    return SessionEnd {
                        state: d.job.state,
                        exit_code: d.job.exit_code,
                        message,
                    };
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        SessionEnd {
            state: JobState::Running,
            exit_code: None,
            message: "its terminal closed; see `gantry show` for how it ended".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_come_15_and_5_minutes_before_the_end_and_never_twice() {
        let min = 60_000;
        let end = 100 * min;
        #[allow(clippy::type_complexity)] // a table test: one tuple per case reads as the table
        let rows: Vec<(Option<i64>, i64, Option<(i64, u64)>)> = vec![
            (Some(end), 0, Some((85 * min, 15))),
            (Some(end), 85 * min - 1, Some((85 * min, 15))),
            // Past the first warning: the next one.
            (Some(end), 85 * min, Some((95 * min, 5))),
            (Some(end), 90 * min, Some((95 * min, 5))),
            (Some(end), 95 * min, None),
            (Some(end), 120 * min, None),
            (None, 0, None),
        ];
        for (ends, now, want) in rows {
            let got = next_warning(ends, now, &SESSION_WARNINGS).map(|(at, d)| (at, d.as_secs() / 60));
            assert_eq!(got, want, "ends {ends:?}, now {now}");
        }
        assert_eq!(left(14 * min + 1), "15 min");
        assert_eq!(left(5 * min), "5 min");
        assert_eq!(left(150 * min), "2 h 30 min");
        assert_eq!(left(120 * min), "2 h");
    }
}
