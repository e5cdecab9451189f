//! What runs achieved, read while each attempt runs and at its end: its `GANTRY_METRICS` file
//! (JSON lines, [`jsonl`]) and its `tensorboard:` folder's event files ([`tfrecord`]), into the
//! store's results (`store::results`). Every file and folder is opened **as the job's owner**
//! (`access::resolve_as`): a link to a file they may not read reads nothing. A file once opened
//! is kept open for the attempt, read from where its cursor (committed with the points) got to.
//! Everything a job writes is bounded (`[results]`); garbage is counted, never fatal.

mod compare;
pub mod jsonl;
pub mod mlflow;
pub mod tfrecord;

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::Engine;
use crate::access::{self, AccessError, Cred, FileKind};
use crate::defaults::{RESULTS_READ_CHUNK, RESULTS_READ_EVERY_MS};
use crate::protocol::MetricSource;
use crate::store::{Attempt, Cursor, Job, ResultsBatch, ResultsLimits, RunRef};

/// Where each attempt's results folder is inside its container (`GANTRY_METRICS` is a file in it).
pub const RESULTS_MOUNT: &str = "/gantry/results";

/// The `GANTRY_METRICS` file of attempt `n`, as its container sees it.
pub fn metrics_env(n: u32) -> String {
    format!("{RESULTS_MOUNT}/{}", metrics_file_name(n))
}

pub(crate) fn metrics_file_name(n: u32) -> String {
    format!("metrics-{n}.jsonl")
}

/// How many folders deep event files are looked for under `tensorboard:` (Lightning writes
/// `lightning_logs/version_0/`, the Hugging Face Trainer `runs/<date>_<host>/`).
const TB_DEPTH: usize = 3;
/// Most event files followed per attempt.
const TB_FILES: usize = 64;

/// An attempt's reader, stopped (after one last read) by [`Reading::finish`].
pub(super) struct Reading {
    last: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    /// The attempt's MLflow endpoint (its listener and connections): dropped with the attempt.
    mlflow: tokio::task::JoinHandle<()>,
}

impl Reading {
    /// Read once more (the attempt ended) and wait for it.
    pub(super) async fn finish(self) {
        self.mlflow.abort();
        let _ = self.mlflow.await;
        self.last.cancel();
        let _ = self.task.await;
    }

    /// Stop without a last read (the engine is shutting down; the next start reads on).
    pub(super) fn abort(self) {
        self.mlflow.abort();
        self.task.abort();
    }
}

/// One file being followed.
struct Followed {
    key: String,
    file: Option<File>,
    /// Given up for this attempt (not readable as the owner, not a file); noted once.
    refused: bool,
    /// Inside a JSON line too long to be metrics.
    skipping: bool,
}

impl Followed {
    fn new(key: String) -> Followed {
        Followed {
            key,
            file: None,
            refused: false,
            skipping: false,
        }
    }
}

struct State {
    job_id: i64,
    attempt: u32,
    cred: Cred,
    metrics_path: Option<PathBuf>,
    metrics: Followed,
    /// The `tensorboard:` folder on the host, or why there is none.
    tb_dir: Option<Result<PathBuf, String>>,
    tb_files: BTreeMap<PathBuf, Followed>,
    tb_noted: bool,
}

impl Engine {
    /// The host folder of a job's results files (`GANTRY_METRICS`), one per job across attempts.
    pub(crate) fn results_dir(&self, job_id: i64) -> PathBuf {
        self.cfg.paths.state_dir.join("results").join(job_id.to_string())
    }

    /// Make the job's results folder, its owner's (mode 0700) in a folder only the engine may change,
    /// so the path Docker mounts cannot be swapped. `None` when this engine cannot give it to them.
    pub(crate) fn make_results_dir(&self, job: &Job) -> std::io::Result<Option<PathBuf>> {
        use std::os::unix::fs::PermissionsExt;
        let top = self.cfg.paths.state_dir.join("results");
        std::fs::create_dir_all(&top)?;
        std::fs::set_permissions(&top, std::fs::Permissions::from_mode(0o711))?;
        let dir = self.results_dir(job.id);
        let euid = nix::unistd::geteuid().as_raw();
        if euid != 0 && euid != job.owner_uid {
            return Ok(None);
        }
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let m = std::fs::symlink_metadata(&dir)?;
        if !m.is_dir() {
            return Err(std::io::Error::other(format!("{} is not a folder", dir.display())));
        }
        if euid == 0 {
            std::os::unix::fs::lchown(&dir, Some(job.owner_uid), Some(job.owner_gid))?;
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        Ok(Some(dir))
    }

    /// Start reading an attempt's results: every [`RESULTS_READ_EVERY_MS`] until [`Reading::finish`].
    pub(super) fn read_results(self: &Arc<Self>, job: &Job, attempt: &Attempt, run: &RunRef) -> Reading {
        let last = CancellationToken::new();
        // Weak: a reader never keeps a stopped engine (and its state dir's lock) alive.
        let e = Arc::downgrade(self);
        let metrics_path = self.backend.metrics_file(self, job, attempt, run);
        let mut st = State {
            job_id: job.id,
            attempt: attempt.n,
            cred: Cred::of_user(job.owner_uid, job.owner_gid),
            metrics_path,
            metrics: Followed::new("metrics".into()),
            tb_dir: job
                .job
                .spec
                .tensorboard
                .as_ref()
                .map(|t| self.tensorboard_host_dir(job, t)),
            tb_files: BTreeMap::new(),
            tb_noted: false,
        };
        let stop = last.clone();
        let shutdown = self.shutdown.clone();
        let task = tokio::spawn(async move {
            loop {
                let final_read = tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(RESULTS_READ_EVERY_MS)) => false,
                    _ = stop.cancelled() => true,
                    _ = shutdown.cancelled() => return,
                };
                let e2 = e.clone();
                st = match tokio::task::spawn_blocking(move || {
                    if let Some(e) = e2.upgrade().filter(|e| !e.shutdown.is_cancelled()) {
                        e.read_pass(&mut st, final_read);
                    }
                    st
                })
                .await
                {
                    Ok(st) => st,
                    Err(err) => {
                        warn!("the results reader crashed: {err}");
                        return;
                    }
                };
                if final_read {
                    return;
                }
            }
        });
        let mlflow = tokio::spawn(self.clone().mlflow_endpoint(job.clone(), attempt.n, run.clone()));
        Reading { last, task, mlflow }
    }

    /// The attempt's MLflow endpoint, where its backend gives one (`mlflow`): bound in the job's
    /// network namespace, served until the attempt ends. Why there is none is noted on the job.
    async fn mlflow_endpoint(self: Arc<Self>, job: Job, attempt: u32, run: RunRef) {
        let got = self.backend.mlflow_listener(&job, &run).await;
        // Bound (or never to be): the job's command goes on.
        if !matches!(got, Ok(None)) {
            mlflow::open_gate(&self.results_dir(job.id), attempt);
        }
        let e = Arc::downgrade(&self);
        let now = self.now();
        let st = |cred| State {
            job_id: job.id,
            attempt,
            cred,
            metrics_path: None,
            metrics: Followed::new(String::new()),
            tb_dir: None,
            tb_files: BTreeMap::new(),
            tb_noted: false,
        };
        match got {
            Ok(Some((listener, token))) => {
                drop(self);
                mlflow::serve(e, job.id, attempt, listener, token, now).await
            }
            Ok(None) => {}
            // It ended before its endpoint was bound (a job of a second): nothing could log.
            Err(super::EngineError::Exec(crate::executor::ExecError::NotFound(why))) => {
                tracing::debug!(job = job.id, "no MLflow endpoint: {why}")
            }
            Err(err) => {
                let why = format!("MLflow: no endpoint for attempt {attempt} ({err}); its client cannot log here");
                let s = st(Cred::of_user(job.owner_uid, job.owner_gid));
                let this = self.clone();
                let _ = tokio::task::spawn_blocking(move || this.note(&s, MetricSource::Mlflow, why)).await;
            }
        }
    }

    /// Remove the results folder of a job that has ended for good (its last attempt's results were
    /// read into the store, which keeps them as long as the job's history row). A job queued again
    /// (a retry, a preemption) keeps it: its next attempt writes beside the last one's file.
    pub(super) fn remove_results_dir_if_ended(&self, job_id: i64) {
        // One reader guard per statement: a second `reader()` inside the first's would deadlock.
        let job = self.reader().job(job_id);
        let ended = match job {
            Ok(Some(j)) if j.state.is_final() => {
                let open = self.reader().open_attempt(job_id);
                matches!(open, Ok(None))
            }
            Ok(Some(_)) | Err(_) => false,
            Ok(None) => true,
        };
        if ended {
            remove_results_dir(&self.results_dir(job_id));
        }
    }

    /// Remove the results folders of jobs that have ended for good or are gone (deleted by
    /// retention, or ended while the engine was away): at start and with each retention pass.
    pub(super) fn sweep_results_dirs(&self) {
        let Ok(list) = std::fs::read_dir(self.cfg.paths.state_dir.join("results")) else {
            return;
        };
        for d in list.filter_map(|d| d.ok()) {
            if let Some(id) = d.file_name().to_str().and_then(|n| n.parse::<i64>().ok()) {
                self.remove_results_dir_if_ended(id);
            }
        }
    }

    /// The `tensorboard:` folder as a host path: through the job's mounts (and its home, when
    /// mounted), from `workdir` when relative.
    fn tensorboard_host_dir(&self, job: &Job, t: &str) -> Result<PathBuf, String> {
        let inside = if t.starts_with('/') {
            PathBuf::from(t)
        } else {
            Path::new(job.job.spec.workdir.as_deref().unwrap_or("/")).join(t)
        };
        let home = Engine::home_of(job.owner_uid);
        let mut mounts = job.job.mounts.clone();
        mounts.extend(self.policy().containers.home_mount(&job.job, home.as_deref()));
        // The deepest mount holding it wins (as inside the container).
        mounts
            .iter()
            .filter_map(|m| {
                inside
                    .strip_prefix(&m.container)
                    .ok()
                    .map(|rest| (m.container.len(), Path::new(&m.host).join(rest)))
            })
            .max_by_key(|(n, _)| *n)
            .map(|(_, p)| p)
            .ok_or_else(|| {
                format!(
                    "tensorboard: {} is not under one of the job's mounts: Gantry reads event files only from folders mounted from this machine",
                    inside.display()
                )
            })
    }

    /// One read of every source of an attempt (blocking: forks the access helper, reads files).
    fn read_pass(&self, st: &mut State, last: bool) {
        let lim = self.policy().results;
        if let Some(path) = st.metrics_path.clone() {
            let key = st.metrics.key.clone();
            let mut f = std::mem::replace(&mut st.metrics, Followed::new(key));
            self.follow_file(st, &mut f, &path, MetricSource::File, last, &lim);
            st.metrics = f;
        }
        match st.tb_dir.clone() {
            Some(Ok(dir)) => {
                let mut found = vec![];
                if let Err(why) = list_event_files(&st.cred, &dir, TB_DEPTH, &mut found) {
                    if !st.tb_noted {
                        st.tb_noted = true;
                        self.note(st, MetricSource::Tensorboard, why);
                    }
                }
                for p in found {
                    if st.tb_files.len() >= TB_FILES && !st.tb_files.contains_key(&p) {
                        continue;
                    }
                    let rel = p.strip_prefix(&dir).unwrap_or(&p).display().to_string();
                    st.tb_files
                        .entry(p)
                        .or_insert_with(|| Followed::new(format!("tb:{rel}")));
                }
                let paths: Vec<PathBuf> = st.tb_files.keys().cloned().collect();
                for p in paths {
                    let mut f = st.tb_files.remove(&p).expect("listed");
                    self.follow_file(st, &mut f, &p, MetricSource::Tensorboard, last, &lim);
                    st.tb_files.insert(p, f);
                }
            }
            Some(Err(why)) if !st.tb_noted => {
                st.tb_noted = true;
                self.note(st, MetricSource::Tensorboard, why);
            }
            _ => {}
        }
    }

    fn note(&self, st: &State, source: MetricSource, why: String) {
        let mut b = ResultsBatch::new(source);
        b.notes.push(why);
        self.write_batch(st, &b);
    }

    fn write_batch(&self, st: &State, b: &ResultsBatch) {
        let lim = self.policy().results;
        let r = self.store().add_results(st.job_id, st.attempt, b, &lim);
        if let Err(err) = r {
            self.store_failed(&format!("recording the results of job {}", st.job_id), &err);
        }
    }

    /// Read what is new in one file, as the owner, into the store (with its cursor).
    fn follow_file(
        &self,
        st: &State,
        f: &mut Followed,
        path: &Path,
        source: MetricSource,
        last: bool,
        lim: &ResultsLimits,
    ) {
        if f.refused {
            return;
        }
        if f.file.is_none() {
            match open_as(&st.cred, path) {
                Ok(Some(file)) => f.file = Some(file),
                Ok(None) => return,
                Err(why) => {
                    f.refused = true;
                    let what = match source {
                        MetricSource::Tensorboard => "tensorboard",
                        _ => "GANTRY_METRICS",
                    };
                    self.note(st, source, format!("{what}: {why}; nothing read from it"));
                    return;
                }
            }
        }
        let file = f.file.as_ref().expect("opened above");
        let Ok(mut cur) = self.reader().results_cursor(st.job_id, st.attempt, &f.key) else {
            return;
        };
        loop {
            // A pass over a large file (up to `max_bytes` in 4 MiB chunks) yields to a shutdown.
            if self.shutdown.is_cancelled() {
                return;
            }
            let used = self.reader().results_bytes(st.job_id).unwrap_or(0);
            let budget = lim.max_bytes.saturating_sub(used);
            let mut b = ResultsBatch::new(source);
            if budget == 0 {
                let size = file.metadata().map(|m| m.len()).unwrap_or(0);
                if size > cur.offset {
                    b.bytes_unread = size - cur.offset;
                    self.write_batch(st, &b);
                }
                return;
            }
            let want = (RESULTS_READ_CHUNK as u64).min(budget) as usize;
            let mut buf = vec![0u8; want];
            let n = match file.read_at(&mut buf, cur.offset) {
                Ok(n) => n,
                Err(err) => {
                    warn!(job = st.job_id, "reading {}: {err}", path.display());
                    return;
                }
            };
            if n == 0 {
                return;
            }
            buf.truncate(n);
            let at = self.now();
            // The file ends here for now: the last line (or record) may still be being written.
            let whole = n < want;
            let consumed = match source {
                MetricSource::Tensorboard => {
                    let p = tfrecord::parse(&buf);
                    b.points = p.points;
                    b.bad_records = p.bad;
                    if p.broken {
                        f.refused = true;
                        b.notes.push(format!(
                            "tensorboard: {} is not a TFRecord event file (its framing is broken); the rest of it is skipped",
                            f.key.trim_start_matches("tb:")
                        ));
                    }
                    p.consumed
                }
                _ => {
                    let p = jsonl::parse(&buf, last && whole, f.skipping, cur.lines, at);
                    f.skipping = p.skipping;
                    if let Some(line) = p.first_garbage {
                        b.notes.push(format!(
                            "GANTRY_METRICS: lines that are not JSON objects are skipped (first: attempt {}, line {line})",
                            st.attempt
                        ));
                    }
                    b.garbage_lines = p.garbage;
                    b.points = p.points;
                    cur.lines += p.lines;
                    p.consumed
                }
            };
            if consumed == 0 && !whole && want as u64 == budget {
                // What is left of the bound does not hold the next line (or record): reached.
                let size = file.metadata().map(|m| m.len()).unwrap_or(0);
                b.bytes_unread = size.saturating_sub(cur.offset);
            }
            cur.offset += consumed as u64;
            b.bytes = consumed as u64;
            b.cursor = Some(Cursor {
                key: f.key.clone(),
                offset: cur.offset,
                lines: cur.lines,
            });
            if consumed == 0 && !b.notes.is_empty() {
                b.cursor = None;
            }
            if !b.is_empty() {
                self.write_batch(st, &b);
            }
            if consumed == 0 || whole || f.refused {
                return;
            }
        }
    }
}

/// Remove a job's results folder (and what its owner left in it). Safe in a folder its owner writes:
/// the path up to it is the engine's own (`results/` is root's, 0711), and `remove_dir_all` never
/// follows a link inside it.
fn remove_results_dir(dir: &Path) {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => warn!("removing {}: {e}", dir.display()),
    }
}

/// Open `path` for reading as `cred` would: `Ok(None)` while it does not exist yet.
fn open_as(cred: &Cred, path: &Path) -> Result<Option<File>, String> {
    // Nothing there yet (most passes of a job that logs nothing): no helper forked to learn that.
    if std::fs::symlink_metadata(path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        return Ok(None);
    }
    match access::resolve_as(cred, path, false) {
        Ok(r) if r.kind == FileKind::File => {
            // The file the owner's own open reached, opened for reading by the engine.
            let fd = format!("/proc/self/fd/{}", r.file.as_raw_fd());
            File::open(fd).map(Some).map_err(|e| format!("{}: {e}", path.display()))
        }
        Ok(r) => Err(format!("{} is not a regular file", r.path.display())),
        Err(AccessError::Missing { .. }) => Ok(None),
        Err(e) => Err(format!("{} is not readable as {}: {e}", path.display(), cred.name)),
    }
}

/// Event files (`*tfevents*`) under `dir`, `depth` folders deep, each folder listed as `cred`.
fn list_event_files(cred: &Cred, dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let r = match access::resolve_as(cred, dir, false) {
        Ok(r) => r,
        Err(AccessError::Missing { .. }) => return Ok(()),
        Err(e) => {
            return Err(format!(
                "tensorboard: {} is not readable as {}: {e}",
                dir.display(),
                cred.name
            ))
        }
    };
    if r.kind != FileKind::Directory {
        return Err(format!("tensorboard: {} is not a folder", dir.display()));
    }
    let listing = std::fs::read_dir(format!("/proc/self/fd/{}", r.file.as_raw_fd()))
        .map_err(|e| format!("tensorboard: cannot list {}: {e}", dir.display()))?;
    let mut names: Vec<(String, bool)> = listing
        .filter_map(|d| d.ok())
        .filter_map(|d| {
            let is_dir = d.file_type().ok()?.is_dir();
            Some((d.file_name().to_str()?.to_string(), is_dir))
        })
        .collect();
    names.sort();
    for (name, is_dir) in names.into_iter().take(4 * TB_FILES) {
        // Below the folder the owner's open resolved to (links inside it are followed as them again).
        let p = r.path.join(&name);
        if is_dir && depth > 0 {
            let _ = list_event_files(cred, &p, depth - 1, out);
        } else if !is_dir && name.contains("tfevents") {
            out.push(p);
        }
        if out.len() >= TB_FILES {
            break;
        }
    }
    Ok(())
}
