//! Client for the engine's Unix-socket API (used by the CLI and the desktop app).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixStream;

use crate::config::Paths;
use crate::machine_lock::{Holder, LockError};
use crate::protocol::routes::{self, fill, with_query};
use crate::protocol::{
    ApiError, EngineEvent, EngineKind, EngineView, GpuMinute, GpuStatus, HistoryFilter, HistoryRow, InboxInfo,
    JobDetailView, JobState, LogQuery, Preview, PriorityRequest, QueueEntryView, QueuePage, QueuePageQuery, Range,
    RecentSample, Since, StatusInfo, SubmitRequest, Submitted, TimelineRun, UsageQuery, UsageReport, WhoAmI,
};
use crate::spec::{SpecError, ValidJob, MAX_SPEC_BYTES};

mod locate;
mod target;

pub use locate::*;
pub use target::*;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no Gantry engine is running at {0}: start it with `gantry daemon` or open the Gantry app")]
    NoEngine(PathBuf),
    #[error("cannot connect to the engine at {}: {error}", socket.display())]
    Connect { socket: PathBuf, error: std::io::Error },
    #[error("the engine at {} did not answer within {}: it may be overloaded; see its log or `gantry status`", socket.display(), humantime::format_duration(*after))]
    Timeout { socket: PathBuf, after: Duration },
    #[error("{message}")]
    Api {
        status: u16,
        message: String,
        spec_error: Option<SpecError>,
    },
    #[error("talking to the engine failed: {0}")]
    Protocol(String),
    /// The connection ended (reset, or closed) after the request went out and before the whole
    /// answer came back: the engine may or may not have done it (it stopped or restarted meanwhile).
    #[error("the connection to the engine ended before it answered ({0}): it may have stopped or restarted; see `gantry status`")]
    Interrupted(String),
    #[error("{0}")]
    File(String),
    /// `ssh HOST gantry proxy` ended before the engine answered; `message` is what ssh (or the remote
    /// `gantry proxy`) wrote on stderr.
    #[error("cannot reach the Gantry engine on {host} through ssh: {message}")]
    Remote { host: String, message: String },
}

/// Read a spec file the way every client does: size-capped UTF-8, relative mounts resolved
/// against the file's own folder.
pub fn read_spec_file(path: &Path) -> Result<SubmitRequest, ClientError> {
    let meta =
        std::fs::metadata(path).map_err(|e| ClientError::File(format!("cannot read {}: {e}", path.display())))?;
    if !meta.is_file() {
        return Err(ClientError::File(format!("{} is not a file", path.display())));
    }
    if meta.len() > MAX_SPEC_BYTES {
        return Err(ClientError::File(format!(
            "the file is {} bytes; job files are limited to {MAX_SPEC_BYTES} bytes",
            meta.len()
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| ClientError::File(format!("cannot read {} as UTF-8 text: {e}", path.display())))?;
    let abs = std::fs::canonicalize(path).map_err(|e| ClientError::File(e.to_string()))?;
    Ok(SubmitRequest {
        text,
        file_name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        base_dir: abs.parent().map(Path::to_path_buf),
        idempotency_key: None,
        origin: Default::default(),
        begin: None,
    })
}

/// A fresh idempotency key for one submission: 128 random bits, in hex.
pub fn new_submit_key() -> String {
    use std::io::Read;
    let mut b = [0u8; 16];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)) {
        Ok(()) => b.iter().map(|x| format!("{x:02x}")).collect(),
        // Unique still (the key only has to differ from this user's other submits of the day).
        Err(_) => {
            static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            format!(
                "{}-{nanos}-{}",
                std::process::id(),
                N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            )
        }
    }
}

/// How long a request (connect, send, whole answer) may take; streams only wait this long for the
/// answer to start. The engine answers in milliseconds; 30 s means it is stuck or flooded.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// While the socket's accept queue is full, retry the connect this often (within the timeout).
const CONNECT_RETRY: Duration = Duration::from_millis(50);
/// After a submit lost its answer, look for the (restarting) engine this often (within the timeout).
const RESEND_POLL: Duration = Duration::from_millis(100);

#[derive(Debug, Clone)]
pub struct Client {
    target: Target,
    timeout: Duration,
}

impl Client {
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Client::to(Target::Socket(socket.into()))
    }

    pub fn to(target: Target) -> Self {
        Client {
            target,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    pub fn with_timeout(self, timeout: Duration) -> Self {
        Client { timeout, ..self }
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// `fut` within the timeout, or [`ClientError::Timeout`].
    async fn bounded<T>(&self, fut: impl Future<Output = Result<T, ClientError>>) -> Result<T, ClientError> {
        tokio::time::timeout(self.timeout, fut).await.unwrap_or_else(|_| {
            Err(ClientError::Timeout {
                socket: PathBuf::from(self.target.describe()),
                after: self.timeout,
            })
        })
    }

    /// A connection, and for ssh the task collecting its stderr (the reason when it fails).
    async fn connect(&self) -> Result<(Box<dyn Io>, Option<tokio::task::JoinHandle<String>>), ClientError> {
        let socket = match &self.target {
            Target::Socket(s) => s,
            Target::Ssh { host, .. } => {
                let mut cmd = self.target.command().expect("ssh target");
                cmd.stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .kill_on_drop(true);
                let mut child = cmd.spawn().map_err(|e| ClientError::Remote {
                    host: host.clone(),
                    message: format!("cannot run {:?}: {e}", cmd.as_std().get_program()),
                })?;
                let (stdout, stdin, mut stderr) = (
                    child.stdout.take().unwrap(),
                    child.stdin.take().unwrap(),
                    child.stderr.take().unwrap(),
                );
                // Drained all along (ssh must never block on a full pipe), kept to explain a failure.
                let errors = tokio::spawn(async move {
                    use tokio::io::AsyncReadExt;
                    let mut buf = Vec::new();
                    let _ = (&mut stderr).take(64 * 1024).read_to_end(&mut buf).await;
                    let _ = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
                    String::from_utf8_lossy(&buf).trim().to_string()
                });
                return Ok((
                    Box::new(SshIo {
                        io: tokio::io::join(stdout, stdin),
                        _child: child,
                    }),
                    Some(errors),
                ));
            }
        };
        loop {
            match UnixStream::connect(socket).await {
                Ok(s) => return Ok((Box::new(s), None)),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                    ) =>
                {
                    return Err(ClientError::NoEngine(socket.clone()))
                }
                // EAGAIN: the engine's accept queue is full; it may drain.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => tokio::time::sleep(CONNECT_RETRY).await,
                Err(error) => {
                    return Err(ClientError::Connect {
                        socket: socket.clone(),
                        error,
                    })
                }
            }
        }
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        let (stream, errors) = self.connect().await?;
        let sent = async {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| ClientError::Protocol(e.to_string()))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let req = Request::builder()
                .method(method)
                .uri(path)
                .header("host", "gantry")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body.unwrap_or_default())))
                .map_err(|e| ClientError::Protocol(e.to_string()))?;
            sender
                .send_request(req)
                .await
                .map_err(|e| ClientError::Interrupted(e.to_string()))
        };
        let resp = match (sent.await, errors, &self.target) {
            (Ok(r), _, _) => r,
            // The connection ended before an answer: ssh or the remote proxy says why on stderr.
            (Err(e), Some(errors), Target::Ssh { host, .. }) => {
                let said = tokio::time::timeout(Duration::from_secs(5), errors)
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or_default();
                let message = if said.is_empty() {
                    format!("ssh closed the connection ({e})")
                } else {
                    said.lines()
                        .map(|l| l.strip_prefix("gantry: ").unwrap_or(l))
                        .collect::<Vec<_>>()
                        .join("; ")
                };
                return Err(ClientError::Remote {
                    host: host.clone(),
                    message,
                });
            }
            (Err(e), _, _) => return Err(e),
        };
        if !resp.status().is_success() {
            return Err(refusal(resp).await);
        }
        Ok(resp)
    }

    /// Join a running session's terminal (`gantry attach`, `gantry shell`): the connection, upgraded,
    /// carries [`crate::protocol::terminal`] frames both ways until the session ends or it is
    /// dropped (detaching). Only connecting and the engine's answer are bounded by the timeout.
    pub async fn attach(&self, id: i64) -> Result<TokioIo<hyper::upgrade::Upgraded>, ClientError> {
        use crate::protocol::terminal::UPGRADE;
        self.bounded(async {
            let (stream, errors) = self.connect().await?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| ClientError::Protocol(e.to_string()))?;
            tokio::spawn(async move {
                let _ = conn.with_upgrades().await;
            });
            let req = Request::builder()
                .method("GET")
                .uri(fill(routes::ATTACH, id))
                .header("host", "gantry")
                .header("connection", "upgrade")
                .header("upgrade", UPGRADE)
                .body(Full::new(Bytes::new()))
                .map_err(|e| ClientError::Protocol(e.to_string()))?;
            let resp = match (sender.send_request(req).await, errors, &self.target) {
                (Ok(r), _, _) => r,
                (Err(e), Some(errors), Target::Ssh { host, .. }) => {
                    let said = tokio::time::timeout(Duration::from_secs(5), errors)
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .unwrap_or_default();
                    let message = if said.is_empty() {
                        format!("ssh closed the connection ({e})")
                    } else {
                        said
                    };
                    return Err(ClientError::Remote {
                        host: host.clone(),
                        message,
                    });
                }
                (Err(e), _, _) => return Err(ClientError::Interrupted(e.to_string())),
            };
            if resp.status() != hyper::StatusCode::SWITCHING_PROTOCOLS {
                return Err(refusal(resp).await);
            }
            let upgraded = hyper::upgrade::on(resp)
                .await
                .map_err(|e| ClientError::Protocol(format!("the terminal connection failed: {e}")))?;
            Ok(TokioIo::new(upgraded))
        })
        .await
    }

    async fn json<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, ClientError> {
        let bytes = self.bytes(method, path, body).await?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Protocol(format!("unexpected reply: {e}")))
    }

    /// A whole answer, within the timeout.
    async fn bytes(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<Bytes, ClientError> {
        self.bounded(async {
            let resp = self.send(method, path, body).await?;
            Ok(resp
                .into_body()
                .collect()
                .await
                .map_err(|e| ClientError::Interrupted(e.to_string()))?
                .to_bytes())
        })
        .await
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.json("GET", path, None).await
    }

    async fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> Result<T, ClientError> {
        let b = serde_json::to_vec(body).map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.json("POST", path, Some(b)).await
    }

    /// Stream a response body chunk by chunk (logs with follow, events). Only the start of the
    /// answer is bounded by the timeout: a stream may stay quiet for as long as the job runs.
    async fn stream(&self, path: &str, mut on_chunk: impl FnMut(&[u8]) -> bool) -> Result<(), ClientError> {
        let mut body = self.bounded(self.send("GET", path, None)).await?.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ClientError::Protocol(e.to_string()))?;
            if let Some(data) = frame.data_ref() {
                if !on_chunk(data) {
                    break;
                }
            }
        }
        Ok(())
    }

    async fn raw(&self, path: &str) -> Result<Vec<u8>, ClientError> {
        Ok(self.bytes("GET", path, None).await?.to_vec())
    }

    // One method per route of `protocol::routes`, in its order.

    /// The engine's version, GPUs, drop folder and health.
    pub async fn status(&self) -> Result<StatusInfo, ClientError> {
        self.get(routes::STATUS).await
    }

    /// The caller, as the engine sees them (peer credentials).
    pub async fn whoami(&self) -> Result<WhoAmI, ClientError> {
        self.get(routes::WHOAMI).await
    }

    /// Running and queued jobs, with why each queued one waits.
    pub async fn queue(&self) -> Result<Vec<QueueEntryView>, ClientError> {
        self.get(routes::JOBS).await
    }

    /// What `gantry ls` shows: every started job, the first `limit` queued ones in scheduling
    /// order and the first `limit` of the caller's own, with how many are queued in all.
    pub async fn queue_page(&self, limit: usize) -> Result<QueuePage, ClientError> {
        self.get(&with_query(routes::QUEUE_PAGE, &QueuePageQuery { limit })?)
            .await
    }

    /// Queue one spec (its text); [`Client::submit_file`] reads a file first. The request carries an
    /// idempotency key (a new one unless `req` has one), so when the connection ends before the
    /// answer (the engine crashed, perhaps after queueing it) it is sent once more, as soon as the
    /// engine answers again (within the timeout), and the engine answers with the jobs of the first
    /// try instead of queueing them twice.
    pub async fn submit(&self, req: &SubmitRequest) -> Result<Submitted, ClientError> {
        let mut req = req.clone();
        req.idempotency_key.get_or_insert_with(new_submit_key);
        let body = serde_json::to_vec(&req).map_err(|e| ClientError::Protocol(e.to_string()))?;
        match self.json("POST", routes::JOBS, Some(body.clone())).await {
            // Over ssh a lost answer and a failed ssh look alike (`Remote`): not sent again.
            Err(ClientError::Interrupted(_)) if matches!(self.target, Target::Socket(_)) => {
                self.resend(routes::JOBS, body).await
            }
            done => done,
        }
    }

    /// A request once more, after its answer was lost: while the engine is not back (refused, no
    /// socket) nothing was sent, so this waits for it, within the timeout.
    async fn resend<T: DeserializeOwned>(&self, path: &str, body: Vec<u8>) -> Result<T, ClientError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            match self.json("POST", path, Some(body.clone())).await {
                Err(ClientError::NoEngine(_)) if tokio::time::Instant::now() + RESEND_POLL < deadline => {
                    tokio::time::sleep(RESEND_POLL).await
                }
                done => return done,
            }
        }
    }

    /// Queue one spec file; returns the job ids (several for a `matrix`).
    pub async fn submit_file(&self, path: &Path) -> Result<Vec<i64>, ClientError> {
        let req = self.spec_request(path)?;
        Ok(self.submit(&req).await?.job_ids)
    }

    pub async fn job(&self, id: i64) -> Result<JobDetailView, ClientError> {
        self.get(&fill(routes::JOB, id)).await
    }

    /// Cancel a job; returns the state it was in.
    pub async fn cancel(&self, id: i64) -> Result<JobState, ClientError> {
        self.post(&fill(routes::CANCEL, id), &()).await
    }

    /// `false` when the job is no longer queued (only queued jobs change priority).
    pub async fn set_priority(&self, id: i64, priority: i32) -> Result<bool, ClientError> {
        self.post(&fill(routes::PRIORITY, id), &PriorityRequest { priority })
            .await
    }

    /// `true` when the job was queued and not held yet.
    pub async fn hold(&self, id: i64) -> Result<bool, ClientError> {
        self.post(&fill(routes::HOLD, id), &()).await
    }

    /// `true` when the job was held.
    pub async fn release(&self, id: i64) -> Result<bool, ClientError> {
        self.post(&fill(routes::RELEASE, id), &()).await
    }

    /// Queue a copy of one of the caller's jobs.
    pub async fn rerun(&self, id: i64) -> Result<Submitted, ClientError> {
        self.post(&fill(routes::RERUN, id), &()).await
    }

    /// The job's output so far.
    pub async fn logs(&self, id: i64) -> Result<Vec<u8>, ClientError> {
        self.raw(&fill(routes::LOGS, id)).await
    }

    /// The job's output so far, chunk by chunk as the engine streams it (`on_chunk` returns false
    /// to stop): a long log is never held whole, and only its start is bounded by the timeout.
    pub async fn logs_chunks(&self, id: i64, on_chunk: impl FnMut(&[u8]) -> bool) -> Result<(), ClientError> {
        self.stream(&fill(routes::LOGS, id), on_chunk).await
    }

    /// The job's output as it is written, until the job ends or `on_chunk` returns false.
    pub async fn follow_logs(&self, id: i64, on_chunk: impl FnMut(&[u8]) -> bool) -> Result<(), ClientError> {
        self.stream(
            &with_query(&fill(routes::LOGS, id), &LogQuery { follow: true })?,
            on_chunk,
        )
        .await
    }

    /// A loopback URL on the engine's machine reaching one of the job's `ports` (default: its first).
    pub async fn open_port(
        &self,
        id: i64,
        port: Option<u16>,
    ) -> Result<crate::protocol::terminal::Opened, ClientError> {
        self.post(
            &fill(routes::OPEN, id),
            &crate::protocol::terminal::OpenRequest { port },
        )
        .await
    }

    /// Queue session `ask` (the app's "Start a session"; `gantry shell` and `notebook` write the same
    /// spec): a shell without an image runs in this machine's folders, a notebook in the lab's
    /// `[sessions] notebook_image`. Its id; attach with `gantry attach ID`, open a port with
    /// [`Client::open_port`] once it runs.
    pub async fn start_session(&self, ask: &crate::protocol::SessionAsk) -> Result<Submitted, ClientError> {
        let image = match (&ask.image, ask.notebook_port) {
            (Some(i), _) if !i.trim().is_empty() => i.trim().to_string(),
            (_, None) => crate::spec::HOST_IMAGE.into(),
            (_, Some(_)) => self.status().await?.notebook_image.ok_or_else(|| {
                ClientError::File("the lab config names no notebook image (`[sessions] notebook_image`): give an image with `jupyter lab` in it (e.g. quay.io/jupyter/pytorch-notebook:cuda12-latest)".into())
            })?,
        };
        let spec = crate::spec::session_spec(ask, image, &new_submit_key());
        let text = serde_yaml_ng::to_string(&spec)
            .map_err(|e| ClientError::File(format!("writing the session's spec: {e}")))?;
        let name = if ask.notebook_port.is_some() {
            "notebook.yaml"
        } else {
            "shell.yaml"
        };
        self.submit(&SubmitRequest {
            text,
            file_name: name.into(),
            base_dir: None,
            idempotency_key: None,
            origin: crate::protocol::SpecOrigin::Session,
            begin: None,
        })
        .await
    }

    /// Check a spec without queueing it.
    pub async fn validate(&self, req: &SubmitRequest) -> Result<ValidJob, ClientError> {
        self.post(routes::VALIDATE, req).await
    }

    /// A dry run of [`Client::submit`]: every check the submit makes, as the caller, and where and
    /// when its jobs would start; nothing queued.
    pub async fn preview(&self, req: &SubmitRequest) -> Result<crate::protocol::SubmitPreview, ClientError> {
        self.post(routes::PREVIEW, req).await
    }

    /// Check one spec file without queueing it.
    pub async fn preview_file(&self, path: &Path) -> Result<Preview, ClientError> {
        let file_name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut p = Preview {
            path: path.to_path_buf(),
            file_name,
            job: None,
            error: None,
            spec_error: None,
            plan: None,
        };
        let req = match self.spec_request(path) {
            Err(e) => {
                p.error = Some(e.to_string());
                return Ok(p);
            }
            Ok(req) => req,
        };
        // The check, then the dry run: where and when it would start, or the submit's refusal of a
        // valid spec (the lab's limits, a mount its owner may not read, the queued-jobs cap), shown
        // before Submit rather than after it.
        let checked = match self.validate(&req).await {
            Ok(j) => match self.preview(&req).await {
                Ok(plan) => Ok((j, Some(plan))),
                // An engine without dry runs: the check is all it says.
                Err(ClientError::Api { status: 404 | 405, .. }) => Ok((j, None)),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        match checked {
            Ok((j, plan)) => {
                p.job = Some(j);
                p.plan = plan;
            }
            Err(ClientError::Api {
                message, spec_error, ..
            }) => {
                p.error = Some(message);
                p.spec_error = spec_error;
            }
            Err(e) => return Err(e),
        }
        Ok(p)
    }

    /// GPUs, their load and who holds them.
    pub async fn gpus(&self) -> Result<GpuStatus, ClientError> {
        self.get(routes::GPUS).await
    }

    /// 1 Hz samples since `since` (ms), at most the last hour.
    pub async fn gpus_recent(&self, since: i64) -> Result<Vec<RecentSample>, ClientError> {
        self.get(&with_query(routes::GPUS_RECENT, &Since { since })?).await
    }

    /// Per-minute figures of GPU `index` in [from, to) (ms).
    pub async fn gpu_minutes(&self, index: u32, from: i64, to: i64) -> Result<Vec<GpuMinute>, ClientError> {
        self.get(&with_query(&fill(routes::GPU_MINUTES, index), &Range { from, to })?)
            .await
    }

    /// Finished runs matching `filter`, one page.
    pub async fn history(&self, filter: &HistoryFilter) -> Result<Vec<HistoryRow>, ClientError> {
        self.get(&with_query(routes::HISTORY, filter)?).await
    }

    /// How many finished runs match `filter` (its page ignored).
    pub async fn history_count(&self, filter: &HistoryFilter) -> Result<i64, ClientError> {
        self.get(&with_query(routes::HISTORY_COUNT, filter)?).await
    }

    /// Runs on the GPU timeline in [from, to) (ms).
    pub async fn timeline(&self, from: i64, to: i64) -> Result<Vec<TimelineRun>, ClientError> {
        self.get(&with_query(routes::TIMELINE, &Range { from, to })?).await
    }

    /// Per-user usage since `since_ms`: GPU-hours, jobs, mean wait, fair share.
    pub async fn usage(&self, since_ms: i64) -> Result<UsageReport, ClientError> {
        self.get(&with_query(routes::USAGE, &UsageQuery { since_ms })?).await
    }

    /// GPU-hours per user per bucket and utilization by local day and hour since `since_ms`.
    pub async fn usage_charts(
        &self,
        q: &crate::protocol::UsageChartsQuery,
    ) -> Result<crate::protocol::UsageCharts, ClientError> {
        self.get(&with_query(routes::USAGE_CHARTS, q)?).await
    }

    /// Per user GPU-hours held vs used and mean CPU efficiency since `since_ms`, and the machine's per
    /// local day (`gantry usage --efficiency`, the Usage view).
    pub async fn usage_efficiency(
        &self,
        q: &crate::protocol::EfficiencyQuery,
    ) -> Result<crate::protocol::EfficiencyReport, ClientError> {
        self.get(&with_query(routes::USAGE_EFFICIENCY, q)?).await
    }

    /// What job `id` logged: its metric series (at most `max_points` points each: `Some(0)` for the
    /// summaries alone, `None` for every stored point), params and tags. Owner and admins only.
    pub async fn job_results(
        &self,
        id: i64,
        max_points: Option<u32>,
    ) -> Result<crate::protocol::JobResults, ClientError> {
        self.get(&with_query(
            &fill(routes::RESULTS, id),
            &crate::protocol::ResultsQuery { max_points },
        )?)
        .await
    }

    /// Runs side by side (by ids or by name), best first by `q.sort`.
    pub async fn compare(&self, q: &crate::protocol::CompareQuery) -> Result<crate::protocol::Comparison, ClientError> {
        self.get(&with_query(routes::COMPARE, q)?).await
    }

    /// The caller's notification targets, then the lab's webhooks.
    pub async fn notify_list(&self) -> Result<Vec<crate::protocol::Subscription>, ClientError> {
        self.get(routes::NOTIFY).await
    }

    /// Add a notification target for the caller (`gantry notify add`).
    pub async fn notify_add(
        &self,
        req: &crate::protocol::NotifyAdd,
    ) -> Result<crate::protocol::Subscription, ClientError> {
        self.post(routes::NOTIFY, req).await
    }

    /// Remove one of the caller's targets; `true` when it existed.
    pub async fn notify_remove(&self, id: i64) -> Result<bool, ClientError> {
        self.post(&fill(routes::NOTIFY_REMOVE, id), &()).await
    }

    /// A test notification to each of the caller's targets.
    pub async fn notify_test(&self) -> Result<Vec<crate::protocol::NotifyDelivery>, ClientError> {
        self.post(routes::NOTIFY_TEST, &()).await
    }

    /// The caller's notifications, newest first.
    pub async fn notify_log(&self, limit: u32) -> Result<Vec<crate::protocol::NotifyDelivery>, ClientError> {
        self.get(&with_query(
            routes::NOTIFY_LOG,
            &crate::protocol::NotifyLogQuery { limit: Some(limit) },
        )?)
        .await
    }

    /// Every open booking (with `all`, closed ones too) and the lab's rules (`gantry bookings`).
    pub async fn bookings(&self, q: &crate::protocol::BookingsQuery) -> Result<crate::protocol::Bookings, ClientError> {
        self.get(&with_query(routes::BOOKINGS, q)?).await
    }

    /// Book GPUs for the caller (`gantry book`): the new booking.
    pub async fn book(&self, req: &crate::protocol::BookRequest) -> Result<crate::protocol::BookingView, ClientError> {
        self.post(routes::BOOKINGS, req).await
    }

    /// Cancel a booking (its owner or root; `gantry book cancel`): the booking as it is now.
    pub async fn cancel_booking(&self, id: i64) -> Result<crate::protocol::BookingView, ClientError> {
        self.post(&fill(routes::BOOKING_CANCEL, id), &()).await
    }

    /// The caller's drop folder and whether the engine watches it.
    pub async fn inbox(&self) -> Result<InboxInfo, ClientError> {
        self.get(routes::INBOX).await
    }

    /// Have the engine watch the drop folder the caller just made (`gantry inbox init`).
    pub async fn inbox_init(&self) -> Result<InboxInfo, ClientError> {
        self.post(routes::INBOX, &()).await
    }

    /// The engine's events (state changes, GPU samples) as they happen, until `on_event` returns
    /// false or the connection ends. A line that does not parse (a newer engine's kind) is skipped.
    pub async fn events(&self, mut on_event: impl FnMut(EngineEvent) -> bool) -> Result<(), ClientError> {
        let mut buf = Vec::new();
        self.stream(routes::EVENTS, |chunk| for_each_line(&mut buf, chunk, &mut on_event))
            .await
    }

    /// [`read_spec_file`], for this engine: a remote one gets the text alone, since this computer's
    /// folders mean nothing on the workstation (the engine then refuses relative mounts, saying why).
    pub fn spec_request(&self, path: &Path) -> Result<SubmitRequest, ClientError> {
        let req = read_spec_file(path)?;
        Ok(match self.target {
            Target::Socket(_) => req,
            Target::Ssh { .. } => SubmitRequest { base_dir: None, ..req },
        })
    }
}

/// The engine's refusal (its JSON error, or the body as text).
async fn refusal(resp: hyper::Response<hyper::body::Incoming>) -> ClientError {
    let status = resp.status().as_u16();
    let bytes = match resp.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return ClientError::Protocol(e.to_string()),
    };
    match serde_json::from_slice::<ApiError>(&bytes) {
        Ok(e) => ClientError::Api {
            status,
            message: e.error,
            spec_error: e.spec_error,
        },
        Err(_) => ClientError::Api {
            status,
            message: String::from_utf8_lossy(&bytes).into_owned(),
            spec_error: None,
        },
    }
}

/// Split a byte stream into newline-delimited JSON values; `f` returns false to stop.
fn for_each_line<T: DeserializeOwned>(buf: &mut Vec<u8>, chunk: &[u8], f: &mut impl FnMut(T) -> bool) -> bool {
    buf.extend_from_slice(chunk);
    while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
        let line: Vec<u8> = buf.drain(..=pos).collect();
        if let Ok(v) = serde_json::from_slice::<T>(&line) {
            if !f(v) {
                return false;
            }
        }
    }
    true
}

impl From<serde_urlencoded::ser::Error> for ClientError {
    fn from(e: serde_urlencoded::ser::Error) -> Self {
        ClientError::Protocol(format!("cannot write the query: {e}"))
    }
}

#[cfg(test)]
mod tests;
