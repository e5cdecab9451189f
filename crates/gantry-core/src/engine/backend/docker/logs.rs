//! Following a container: its output copied into the job's log (resuming after Docker outages and
//! engine restarts), its exit, and stopping it on cancel or timeout.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::config::DOCKER_RETRY;
use crate::engine::backend::{Seen, Since, Watch};
use crate::engine::joblog::CappedLog;
use crate::engine::Engine;
use crate::executor::{ExecError, Executor};
use crate::outcome::{How, Stop};
use crate::store::{Attempt, Job};

/// After a container exits, its log copy gets this long to drain before the end is recorded.
const LOG_DRAIN: Duration = Duration::from_secs(10);
/// Before the last read of an exited container's stored output: Docker's log copier may trail the exit.
const CATCH_UP_DELAY: Duration = Duration::from_millis(200);

/// One container followed to its end. Launched or reattached: its output is copied by a task of its
/// own while `next` waits for the exit; ended while the engine was away: `next` copies what is left
/// and reads its real exit code.
pub(super) struct DockerWatch {
    exec: Arc<dyn Executor>,
    e: Arc<Engine>,
    job_id: i64,
    timeout_ms: Option<i64>,
    cid: String,
    log: PathBuf,
    /// The attempt's start, from which its timeout counts; `None` once said.
    started_at: Option<i64>,
    away: bool,
    logs: Option<JoinHandle<()>>,
    log_stop: CancellationToken,
    stop: Option<Stop>,
    /// How it ended, decided when `wait` returned (a stop asked after that does not change it).
    ended: Option<How>,
}

impl DockerWatch {
    pub fn new(exec: Arc<dyn Executor>, e: Arc<Engine>, job: &Job, attempt: &Attempt, cid: &str, since: Since) -> DockerWatch {
        let log = e.log_of(job.id);
        let away = since == Since::EndedWhileAway;
        let log_stop = CancellationToken::new();
        let logs = (!away).then(|| {
            let (exec, cid, path, cap, stop) = (exec.clone(), cid.to_string(), log.clone(), e.policy().log_cap, log_stop.clone());
            tokio::spawn(async move {
                if let Err(err) = follow_logs(exec, &cid, &path, cap, stop).await {
                    warn!("log copy for {cid}: {err}");
                }
            })
        });
        DockerWatch {
            exec,
            job_id: job.id,
            timeout_ms: job.timeout_ms,
            cid: cid.to_string(),
            log,
            started_at: (!away).then_some(attempt.started_at),
            away,
            logs,
            log_stop,
            stop: None,
            ended: None,
            e,
        }
    }
}

#[async_trait::async_trait]
impl Watch for DockerWatch {
    async fn next(&mut self) -> Option<Seen> {
        if self.away {
            // It exited while the engine was away: copy the output we missed, then record its real exit code.
            let cap = self.e.policy().log_cap;
            if let Err(err) = follow_logs(self.exec.clone(), &self.cid, &self.log, cap, CancellationToken::new()).await {
                warn!(job = self.job_id, "could not copy the output of {}: {err}", self.cid);
            }
            let how = match self.exec.exit_of(&self.cid).await {
                Ok(Some(x)) => How::ExitedWhileAway { code: x.code, oom: x.oom_killed },
                Ok(None) => How::Lost("its container claims to run but was listed as exited".into()),
                Err(err) => How::Lost(format!("its container state is unreadable: {err}")),
            };
            return Some(Seen::Ended(how));
        }
        // Its timeout counts from the attempt's start (the claim), as it always did.
        if let Some(since) = self.started_at.take() {
            return Some(Seen::Running { since });
        }
        if self.ended.is_none() {
            let result = loop {
                match self.exec.wait(&self.cid).await {
                    Err(ExecError::DockerUnavailable(m)) => {
                        warn!(job = self.job_id, "lost contact with Docker while waiting ({m}); retrying");
                        tokio::time::sleep(DOCKER_RETRY).await;
                    }
                    r => break r,
                }
            };
            let code = result.as_ref().ok().map(|x| x.code);
            self.ended = Some(match (self.stop, result) {
                (Some(Stop::Timeout), _) => How::TimedOut { code, timeout_ms: self.timeout_ms.unwrap_or(0) },
                (Some(Stop::Cancel), _) => How::Cancelled { code },
                (None, Ok(x)) => How::Exited { code: x.code, oom: x.oom_killed },
                (None, Err(err)) => How::Lost(format!("container vanished: {err}")),
            });
        }
        // The container has ended: its log stream ends too, unless Docker is flaky.
        if let Some(logs) = self.logs.as_mut() {
            if tokio::time::timeout(LOG_DRAIN, &mut *logs).await.is_err() {
                self.log_stop.cancel();
                let _ = logs.await;
            }
            self.logs = None;
        }
        self.ended.clone().map(Seen::Ended)
    }

    async fn stop(&mut self, why: Stop) -> bool {
        if let Err(err) = self.exec.stop(&self.cid, self.e.policy().stop_grace).await {
            warn!(job = self.job_id, "stop failed: {err}");
        }
        self.stop = Some(why);
        true
    }

    async fn detach(&mut self) {
        self.log_stop.cancel();
        if let Some(logs) = self.logs.take() {
            let _ = logs.await;
        }
    }
}

/// A Docker log line's timestamp (`2026-01-02T03:04:05.123456789Z text`), as nanoseconds since the epoch.
fn line_ts(line: &[u8]) -> Option<i128> {
    if !line.first().is_some_and(u8::is_ascii_digit) {
        return None;
    }
    let end = line.iter().position(|c| *c == b' ').unwrap_or(line.len());
    let t = humantime::parse_rfc3339(std::str::from_utf8(&line[..end]).ok()?).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos() as i128)
}

/// Open a job's log to append more output: drop a partial last line (an engine killed mid-write) and
/// return the timestamp of the last Docker line, where to resume.
fn open_for_resume(path: &Path) -> std::io::Result<(std::fs::File, Option<i128>)> {
    let mut f = std::fs::OpenOptions::new().create(true).truncate(false).read(true).write(true).mode(0o600).open(path)?;
    let len = f.metadata()?.len();
    let from = len.saturating_sub(1 << 20);
    f.seek(SeekFrom::Start(from))?;
    let mut tail = vec![];
    f.read_to_end(&mut tail)?;
    let keep = match tail.iter().rposition(|c| *c == b'\n') {
        Some(p) => p + 1,
        None if from == 0 => 0,
        None => tail.len(),
    };
    if keep < tail.len() {
        f.set_len(from + keep as u64)?;
    }
    let last = tail[..keep].split(|c| *c == b'\n').rev().find_map(line_ts);
    f.seek(SeekFrom::End(0))?;
    Ok((f, last))
}

/// Copy a container's output into `path` until the container ends, surviving Docker outages and engine
/// restarts: each (re)connection asks for output since the last line written and skips what is already
/// there, so every line lands exactly once, in order. Capped at `cap` bytes ([`CappedLog`]).
pub(super) async fn follow_logs(exec: Arc<dyn Executor>, cid: &str, path: &Path, cap: u64, stop: CancellationToken) -> std::io::Result<()> {
    let (f, mut last) = open_for_resume(path)?;
    let mut log = CappedLog::new(f, cap)?;
    let mut put = |line: &[u8], last: &mut Option<i128>| -> std::io::Result<()> {
        let ts = line_ts(line);
        if let (Some(t), Some(l)) = (ts, *last) {
            if t <= l {
                return Ok(()); // already copied before a reconnect
            }
        }
        if ts.is_some() {
            *last = ts;
        }
        log.put(line)
    };
    loop {
        let since = last.map(|t| (t / 1_000_000_000) as i64).unwrap_or(0);
        let mut s = exec.logs(cid, since, true);
        let mut pending: Vec<u8> = vec![];
        let broken = loop {
            let item = tokio::select! {
                i = s.next() => i,
                _ = stop.cancelled() => return Ok(()),
            };
            match item {
                None => break false,
                Some(Err(_)) => break true,
                Some(Ok(b)) => {
                    pending.extend_from_slice(&b);
                    while let Some(p) = pending.iter().position(|c| *c == b'\n') {
                        let line: Vec<u8> = pending.drain(..=p).collect();
                        put(&line, &mut last)?;
                    }
                }
            }
        };
        if !broken {
            match exec.exit_of(cid).await {
                Ok(Some(_)) => {
                    // A follow that began as the container exited can end before Docker has stored the
                    // last output: read what is stored once more (lines already copied are skipped).
                    tokio::time::sleep(CATCH_UP_DELAY).await;
                    let since = last.map(|t| (t / 1_000_000_000) as i64).unwrap_or(0);
                    let mut rest = exec.logs(cid, since, false);
                    let mut tail: Vec<u8> = vec![];
                    while let Some(Ok(b)) = rest.next().await {
                        tail.extend_from_slice(&b);
                    }
                    // The final partial line, if any, is in both `pending` and `tail`: keep the fresher read.
                    let tail = if tail.is_empty() { pending } else { tail };
                    for line in tail.split_inclusive(|c| *c == b'\n') {
                        let mut line = line.to_vec();
                        if !line.ends_with(b"\n") {
                            line.push(b'\n');
                        }
                        put(&line, &mut last)?;
                    }
                    return Ok(());
                }
                Err(ExecError::NotFound(_)) => {
                    if !pending.is_empty() {
                        pending.push(b'\n');
                        put(&pending, &mut last)?;
                    }
                    return Ok(());
                }
                Err(ExecError::Rejected(_)) => return Ok(()),
                _ => {} // still running (Docker restarted the stream) or Docker away: follow again
            }
        }
        // A partial line from a cut stream is read again after reconnecting.
        tokio::select! {
            _ = tokio::time::sleep(DOCKER_RETRY) => {}
            _ = stop.cancelled() => return Ok(()),
        }
    }
}
