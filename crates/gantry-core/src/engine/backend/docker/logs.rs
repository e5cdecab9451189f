//! Following a container: its output copied into the job's log (resuming after Docker outages and
//! engine restarts), its exit, and stopping it on cancel or timeout.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::config::DOCKER_RETRY;
use crate::engine::backend::{Seen, Since, Watch};
use crate::engine::joblog::{stamp_len, CappedLog, Lines};
use crate::engine::Engine;
use crate::executor::{ExecError, Executor, Frame};
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
    attempt_id: i64,
    timeout_ms: Option<i64>,
    cid: String,
    log: PathBuf,
    /// The attempt's start, from which its timeout counts; `None` once said.
    started_at: Option<i64>,
    away: bool,
    logs: Option<JoinHandle<()>>,
    log_stop: CancellationToken,
    stop: Option<Stop>,
    /// Its checkpoint signal and grace (preemption); the lab's stop grace where the spec sets none.
    checkpoint: (String, Option<std::time::Duration>),
    /// How it ended, decided when `wait` returned (a stop asked after that does not change it).
    ended: Option<How>,
    /// May it be preempted (its spec, else the lab's default, with preemption on)? One that Docker
    /// itself killed (a restart) is then queued again, as a preemption, not failed.
    preemptible: bool,
}

/// A container's output attached before it started ([`Executor::attach`]): what its job writes before
/// the log copy begins (a progress bar drawn at once) is not lost.
pub(super) type Attached = BoxStream<'static, Result<Frame, ExecError>>;

impl DockerWatch {
    pub fn new(
        exec: Arc<dyn Executor>,
        e: Arc<Engine>,
        job: &Job,
        attempt: &Attempt,
        cid: &str,
        since: Since,
        attached: Option<Attached>,
    ) -> DockerWatch {
        let log = e.log_of(job.id);
        let away = since == Since::EndedWhileAway;
        let log_stop = CancellationToken::new();
        let logs = (!away).then(|| {
            let (exec, cid, path, cap, stop) = (
                exec.clone(),
                cid.to_string(),
                log.clone(),
                e.policy().log_cap,
                log_stop.clone(),
            );
            tokio::spawn(async move {
                if let Err(err) = follow_logs(exec, &cid, &path, cap, stop, attached).await {
                    warn!("log copy for {cid}: {err}");
                }
            })
        });
        DockerWatch {
            exec,
            job_id: job.id,
            attempt_id: attempt.id,
            timeout_ms: job.timeout_ms,
            cid: cid.to_string(),
            log,
            started_at: (!away).then_some(attempt.started_at),
            away,
            logs,
            log_stop,
            stop: None,
            checkpoint: (job.job.spec.checkpoint_signal(), job.job.spec.checkpoint_grace()),
            ended: None,
            preemptible: {
                let p = e.policy();
                p.preemption.enabled && p.preemption.preemptible(&job.job.spec)
            },
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
            if let Err(err) = follow_logs(
                self.exec.clone(),
                &self.cid,
                &self.log,
                cap,
                CancellationToken::new(),
                None,
            )
            .await
            {
                warn!(job = self.job_id, "could not copy the output of {}: {err}", self.cid);
            }
            let how = match self.exec.exit_of(&self.cid).await {
                Ok(Some(x)) => How::ExitedWhileAway {
                    code: x.code,
                    oom: x.oom_killed,
                },
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
            let mut docker_went_away = false;
            let result = loop {
                match self.exec.wait(&self.cid).await {
                    Err(ExecError::DockerUnavailable(m)) => {
                        warn!(
                            job = self.job_id,
                            "lost contact with Docker while waiting ({m}); retrying"
                        );
                        docker_went_away = true;
                        tokio::time::sleep(DOCKER_RETRY).await;
                    }
                    r => break r,
                }
            };
            let code = result.as_ref().ok().map(|x| x.code);
            self.ended = Some(match (self.stop, result) {
                (Some(Stop::Timeout), _) => How::TimedOut {
                    code,
                    timeout_ms: self.timeout_ms.unwrap_or(0),
                },
                // The supervisor words a GPU memory stop (it knows why).
                (Some(Stop::Cancel | Stop::GpuMemory), _) => How::Cancelled { code },
                (Some(Stop::Preempt), _) => How::Preempted {
                    code,
                    by: String::new(),
                },
                // Docker went away and the job died of a signal meanwhile: a Docker restart (without
                // live-restore it stops every container). A preemptible job is queued again, as if
                // preempted (its checkpoint, if it saved one on the SIGTERM, is resumed); not failed.
                (None, Ok(x)) if docker_went_away && self.preemptible && !x.oom_killed && x.code > 128 => {
                    How::Preempted {
                        code: Some(x.code),
                        by: "a Docker restart (it stopped every container)".into(),
                    }
                }
                (None, Ok(x)) => How::Exited {
                    code: x.code,
                    oom: x.oom_killed,
                },
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
        // Recorded first: the stop below returns only once the container exited.
        self.stop = Some(why);
        let done = if why == Stop::Preempt {
            let (signal, grace) = (
                &self.checkpoint.0,
                self.checkpoint.1.unwrap_or(self.e.policy().stop_grace),
            );
            // Its signal goes once per attempt: recorded first, so an engine killed mid-preemption
            // waits out what is left of the grace on restart instead of signalling again.
            let sent = self.e.store().preempt_signalled(self.attempt_id);
            match sent {
                Ok(Some(at)) => {
                    let left = (at + grace.as_millis() as i64 - self.e.now()).max(0) as u64;
                    let ended = tokio::time::timeout(Duration::from_millis(left), self.exec.wait(&self.cid)).await;
                    match ended {
                        Ok(_) => Ok(()),
                        Err(_) => self.exec.stop(&self.cid, Duration::from_secs(1)).await,
                    }
                }
                Ok(None) => self.exec.stop_signal(&self.cid, signal, grace).await,
                Err(err) => {
                    // Not recorded: signalled all the same (a second signal after a crash beats none).
                    self.e
                        .store_failed(&format!("recording the checkpoint signal of job {}", self.job_id), &err);
                    self.exec.stop_signal(&self.cid, signal, grace).await
                }
            }
        } else {
            self.exec.stop(&self.cid, self.e.policy().stop_grace).await
        };
        if let Err(err) = done {
            warn!(job = self.job_id, "stop failed: {err}");
        }
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
/// return the timestamp of the last Docker line, where to resume. In append mode: Gantry's own lines
/// (`append_log`: "preempted by …") are appended by others meanwhile, and a write at this handle's
/// own offset overwrote the start of the one written just before the job's next line.
fn open_for_resume(path: &Path) -> std::io::Result<(std::fs::File, Option<i128>)> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
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

/// A container's output on its way into its log: each stream (stdout, stderr) cut into [`Lines`],
/// each line written with the timestamp of its last frame, frames already copied skipped.
///
/// Docker stamps each stream's messages in order, but stores the two streams in the order its copiers
/// get to its log, not in the order of their stamps: a stderr line stamped after a stdout line can be
/// stored (and read back) before it. So what was copied is known per stream: a frame is skipped only
/// if its own stream already copied a line stamped at or after it.
struct Copy {
    log: CappedLog,
    /// Per stream (stdout, stderr): the timestamp of its last line written, where it resumes.
    last: [Option<i128>; 2],
    lines: [Lines; 2],
    /// The progress state last written per stream (empty: none since its last line).
    shown: [Vec<u8>; 2],
}

impl Copy {
    /// One frame of Docker's log; true when it ended a line of its stream.
    fn frame(&mut self, f: &Frame) -> std::io::Result<bool> {
        let n = stamp_len(&f.data);
        let (stamp, text) = f.data.split_at(n);
        let ts = (n > 0).then(|| line_ts(stamp)).flatten();
        let k = f.stderr as usize;
        if let (Some(t), Some(l)) = (ts, self.last[k]) {
            if t <= l {
                return Ok(false); // already copied before a reconnect
            }
        }
        let (log, last) = (&mut self.log, &mut self.last[k]);
        let mut ended = false;
        self.lines[k].feed(text, |t, cut| {
            log.line(stamp, t, cut)?;
            ended = true;
            if ts.is_some() {
                *last = ts;
            }
            Ok(())
        })?;
        if ended {
            self.shown[k].clear();
        }
        Ok(ended)
    }

    /// Where to ask Docker's log from again (whole seconds): a second before the earliest stream's last
    /// line, so a line of the other stream stored after it but stamped a little before is read too.
    fn since(&self) -> i64 {
        self.last
            .iter()
            .flatten()
            .min()
            .map_or(0, |t| (t / 1_000_000_000) as i64 - 1)
            .max(0)
    }

    /// The output ended: lines without their `\n` are written as they are.
    fn flush(&mut self) -> std::io::Result<()> {
        for k in 0..2 {
            if !self.lines[k].is_empty() {
                let (t, cut) = self.lines[k].state();
                self.log.line(b"", t, cut)?;
                self.lines[k].clear();
            }
        }
        Ok(())
    }

    /// Write the current state of each stream's line not ended yet (from `live` while attached, else
    /// from Docker's log), unless it is what was written last.
    fn progress(&mut self, live: Option<&[Lines; 2]>) -> std::io::Result<()> {
        for k in 0..2 {
            let state = live.map_or(&self.lines[k], |l| &l[k]).state().0;
            let state = &state[..state.len().min(crate::engine::joblog::PROGRESS_MAX)];
            if state.is_empty() || state == self.shown[k].as_slice() {
                continue;
            }
            self.log.progress(state)?;
            self.shown[k] = state.to_vec();
        }
        Ok(())
    }
}

/// What `attach` showed of each stream: the current state of their lines, for progress bars.
#[derive(Default)]
struct Live {
    lines: [Lines; 2],
    /// Output came through `attach` and it is still open.
    attached: bool,
}

/// Follows `attach` (`attached` before the container started, else from now) for as long as it is
/// open, keeping only each stream's current line state (bounded), so Docker is never held up by it.
fn attach_live(
    exec: Arc<dyn Executor>,
    cid: &str,
    live: Arc<std::sync::Mutex<Live>>,
    changed: Arc<Notify>,
    attached: Option<Attached>,
) -> JoinHandle<()> {
    let cid = cid.to_string();
    tokio::spawn(async move {
        let mut s = match attached {
            Some(s) => s,
            None => exec.attach(&cid).await,
        };
        while let Some(Ok(f)) = s.next().await {
            let mut l = live.lock().unwrap();
            l.attached = true;
            let _ = l.lines[f.stderr as usize].feed(&f.data, |_, _| Ok(()));
            drop(l);
            changed.notify_one();
        }
        live.lock().unwrap().attached = false;
        changed.notify_one();
    })
}

/// Aborts a task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Copy a container's output into `path` until the container ends, surviving Docker outages and engine
/// restarts: each (re)connection asks for output since the last line written and skips what is already
/// there, so every line lands exactly once, in order. Capped at `cap` bytes ([`CappedLog`]); lines are
/// cut as [`Lines`] says. While it runs, the current state of a line not ended yet (a progress bar) is
/// written every [`PROGRESS_EVERY`](crate::defaults::PROGRESS_EVERY) at most, from what `attach` shows
/// (Docker's own log holds such a line back until 16 KiB of it have come).
pub(super) async fn follow_logs(
    exec: Arc<dyn Executor>,
    cid: &str,
    path: &Path,
    cap: u64,
    stop: CancellationToken,
    attached: Option<Attached>,
) -> std::io::Result<()> {
    let (f, last) = open_for_resume(path)?;
    let mut copy = Copy {
        log: CappedLog::new(f, cap)?,
        // The file does not say which stream its last line came from: both resume after it (a line of
        // the other stream stored after it but stamped before it, within the same instant, is skipped).
        last: [last; 2],
        lines: Default::default(),
        shown: Default::default(),
    };
    let live = Arc::new(std::sync::Mutex::new(Live::default()));
    let changed = Arc::new(Notify::new());
    let _attached = AbortOnDrop(attach_live(exec.clone(), cid, live.clone(), changed.clone(), attached));
    let mut dirty = false;
    let mut next_progress = tokio::time::Instant::now();
    loop {
        let mut s = exec.logs(cid, copy.since(), true);
        let broken = loop {
            let due = if dirty {
                next_progress
            } else {
                tokio::time::Instant::now() + Duration::from_secs(86_400)
            };
            let item = tokio::select! {
                i = s.next() => i,
                _ = changed.notified() => {
                    dirty = true;
                    continue;
                }
                _ = tokio::time::sleep_until(due), if dirty => {
                    let l = live.lock().unwrap();
                    let from = l.attached.then_some(&l.lines);
                    copy.progress(from)?;
                    drop(l);
                    dirty = false;
                    next_progress = tokio::time::Instant::now() + copy.log.progress_every();
                    continue;
                }
                _ = stop.cancelled() => return Ok(()),
            };
            match item {
                None => break false,
                Some(Err(_)) => break true,
                Some(Ok(f)) => {
                    let ended = copy.frame(&f)?;
                    // A line ended (its state shows again if it is still being written), or Docker's log
                    // brought a line's state: what to show may have changed.
                    dirty |= ended || !copy.lines[f.stderr as usize].is_empty();
                }
            }
        };
        if !broken {
            match exec.exit_of(cid).await {
                Ok(Some(_)) => {
                    // A follow that began as the container exited can end before Docker has stored the
                    // last output: read what is stored once more (lines already copied are skipped, lines
                    // not ended yet are read again; if nothing comes, what was read stays).
                    tokio::time::sleep(CATCH_UP_DELAY).await;
                    let before = std::mem::take(&mut copy.lines);
                    let mut rest = exec.logs(cid, copy.since(), false);
                    let mut any = false;
                    while let Some(Ok(f)) = rest.next().await {
                        any = true;
                        copy.frame(&f)?;
                    }
                    if !any {
                        copy.lines = before;
                    }
                    return copy.flush();
                }
                Err(ExecError::NotFound(_)) => return copy.flush(),
                Err(ExecError::Rejected(_)) => return Ok(()),
                _ => {} // still running (Docker restarted the stream) or Docker away: follow again
            }
        }
        // A line not ended yet is read again after reconnecting.
        copy.lines = Default::default();
        tokio::select! {
            _ = tokio::time::sleep(DOCKER_RETRY) => {}
            _ = stop.cancelled() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::strip_stamps;

    fn copy_to(path: &Path) -> Copy {
        let (f, last) = open_for_resume(path).unwrap();
        Copy {
            log: CappedLog::new(f, 1 << 30).unwrap(),
            last: [last; 2],
            lines: Default::default(),
            shown: Default::default(),
        }
    }

    fn frame(stderr: bool, ts: u32, text: &[u8]) -> Frame {
        let mut d = format!("2026-01-02T03:04:{:02}.{:09}Z ", ts / 1000, ts % 1000).into_bytes();
        d.extend_from_slice(text);
        Frame { stderr, data: d.into() }
    }

    /// Docker cuts a line into 16 KiB messages, each with its own timestamp: the line is stored once,
    /// whole, with no timestamp inside it, and a resumed copy skips exactly what was stored.
    #[test]
    fn a_line_docker_cut_into_messages_is_one_line_without_timestamps_inside() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("j.log");
        let long: Vec<u8> = (0..40_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let mut frames = vec![frame(false, 1, b"before\n")];
        let parts: Vec<&[u8]> = long.chunks(16 << 10).collect();
        for (i, part) in parts.iter().enumerate() {
            frames.push(frame(false, 2 + i as u32, part));
        }
        frames.push(frame(true, 10, b"\r 10%\r 20%"));
        frames.push(frame(false, 11, b"\n"));
        frames.push(frame(true, 12, b"\r100%\n"));
        frames.push(frame(false, 13, b"after\n"));
        let mut c = copy_to(&p);
        for f in &frames[..4] {
            c.frame(f).unwrap();
        }
        // The engine stops here (the long line not ended yet), and resumes.
        drop(c);
        let mut c = copy_to(&p);
        for f in &frames {
            c.frame(f).unwrap();
        }
        c.flush().unwrap();
        let mut want = b"before\n".to_vec();
        want.extend_from_slice(&long);
        want.extend_from_slice(b"\n100%\nafter\n");
        assert_eq!(
            String::from_utf8(strip_stamps(&std::fs::read(&p).unwrap())).unwrap(),
            String::from_utf8(want).unwrap()
        );
    }

    /// Issue 28 (seen in its real-framework runs): Gantry's own line appended while the job's output
    /// is being copied ("preempted by …", written as the job prints "saved at step 212") stays whole;
    /// the copy wrote at its own offset and overwrote its start ("riority 10, this one 0): …").
    #[test]
    fn a_gantry_line_written_between_two_lines_of_output_stays_whole() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("j.log");
        let mut c = copy_to(&p);
        c.frame(&frame(false, 1, b"step 211\n")).unwrap();
        c.flush().unwrap();
        crate::engine::append_log(&p, "preempted by job 4: checkpoint signal, then stop");
        c.frame(&frame(false, 2, b"saved at step 212\n")).unwrap();
        c.flush().unwrap();
        let shown = String::from_utf8(strip_stamps(&std::fs::read(&p).unwrap())).unwrap();
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(lines.len(), 3, "{shown}");
        assert_eq!(lines[0], "step 211");
        assert!(
            lines[1].starts_with("[gantry ")
                && lines[1].ends_with("] preempted by job 4: checkpoint signal, then stop"),
            "{shown}"
        );
        assert_eq!(lines[2], "saved at step 212");
    }

    /// Seen in the integration suite on a loaded machine (`usual_env`): grep printed `CapEff` and
    /// `NoNewPrivs` to stdout after two `touch` errors on stderr, and Docker stored the stderr lines
    /// (stamped after `CapEff`, before `NoNewPrivs`) ahead of `CapEff`. Each of them is copied once.
    #[test]
    fn a_line_stored_after_a_later_stamped_line_of_the_other_stream_is_kept() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("j.log");
        // Docker's log in its stored order (each stream in its own stamps' order).
        let stored = [
            frame(
                true,
                10,
                b"touch: cannot touch '/usr/gantry-probe': Read-only file system\n",
            ),
            frame(
                true,
                11,
                b"touch: cannot touch '/etc/gantry-probe': Read-only file system\n",
            ),
            frame(false, 9, b"CapEff:\t0000000000000000\n"),
            frame(false, 12, b"NoNewPrivs:\t1\n"),
            frame(false, 13, b"gantry-alice\n"),
        ];
        let want = "touch: cannot touch '/usr/gantry-probe': Read-only file system\n\
                    touch: cannot touch '/etc/gantry-probe': Read-only file system\n\
                    CapEff:\t0000000000000000\nNoNewPrivs:\t1\ngantry-alice\n";
        let shown = || String::from_utf8(strip_stamps(&std::fs::read(&p).unwrap())).unwrap();
        let mut c = copy_to(&p);
        for f in &stored {
            c.frame(f).unwrap();
        }
        assert_eq!(shown(), want);
        // Docker restarts the stream (or the copy reads it again after the exit): Docker sends again
        // what it stored since `since`; nothing is copied twice, what is new is copied.
        let first = line_ts(b"2026-01-02T03:04:00.000000009Z").unwrap();
        assert!(
            i128::from(c.since()) * 1_000_000_000 <= first,
            "Docker sends every line again"
        );
        for f in &stored {
            c.frame(f).unwrap();
        }
        c.frame(&frame(true, 14, b"late\n")).unwrap();
        c.flush().unwrap();
        assert_eq!(shown(), format!("{want}late\n"));
    }

    #[test]
    fn progress_shows_the_current_state_once_and_the_line_replaces_it() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("j.log");
        let mut c = copy_to(&p);
        c.frame(&frame(true, 1, b"\r 10%")).unwrap();
        c.progress(None).unwrap();
        c.progress(None).unwrap();
        let mut live: [Lines; 2] = Default::default();
        live[1].feed(b"\r 10%\r 30%", |_, _| Ok(())).unwrap();
        c.progress(Some(&live)).unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap().matches('\r').count(),
            2,
            "each state once"
        );
        assert_eq!(strip_stamps(&std::fs::read(&p).unwrap()), b" 30%\n");
        c.frame(&frame(true, 2, b"\r 30%\r100%\n")).unwrap();
        assert_eq!(strip_stamps(&std::fs::read(&p).unwrap()), b"100%\n");
    }
}
