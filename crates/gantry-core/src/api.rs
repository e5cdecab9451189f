//! The engine's local API: HTTP+JSON on a Unix socket. The caller's identity is the socket's peer
//! credentials (uid/gid), never something the client claims.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::connect_info::{self, ConnectInfo};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio::net::{UnixListener, UnixStream};

use crate::engine::{Engine, EngineError};
use crate::gpu::BackendKind;
use crate::inbox::user_name;
use crate::spec::{Format, Origin, SpecError};
use crate::store::{HistoryFilter, JobState, Owner};

/// Who is calling, from SO_PEERCRED.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
}

impl connect_info::Connected<axum::serve::IncomingStream<'_, UnixListener>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, UnixListener>) -> Self {
        let cred = stream.io().peer_cred().ok();
        // No credentials: treat as "nobody", which owns nothing.
        Peer { uid: cred.map(|c| c.uid()).unwrap_or(65534), gid: cred.map(|c| c.gid()).unwrap_or(65534) }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusInfo {
    pub version: String,
    pub pid: u32,
    pub gpu_backend: BackendKind,
    pub gpu_note: Option<String>,
    pub gpu_count: usize,
    pub inbox: PathBuf,
    pub state_dir: PathBuf,
    pub docker_problem: Option<String>,
    /// Value of the `dev.gantry.engine` label on this engine's containers.
    pub engine_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubmitRequest {
    pub text: String,
    /// File name, for the format (`.yaml`/`.toml`) and the default job name.
    pub file_name: String,
    /// Directory relative mount paths are resolved against.
    pub base_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Submitted {
    /// The first (or only) job.
    pub job_id: i64,
    /// Every job created (a `matrix` makes several).
    #[serde(default)]
    pub job_ids: Vec<i64>,
}

impl Submitted {
    fn of(ids: Vec<i64>) -> Self {
        Submitted { job_id: ids.first().copied().unwrap_or(0), job_ids: ids }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PriorityRequest {
    pub priority: i32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiError {
    pub error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_error: Option<SpecError>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WhoAmI {
    pub uid: u32,
    pub name: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Range {
    pub from: i64,
    pub to: i64,
}

struct Failure(StatusCode, ApiError);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, Json(self.1)).into_response()
    }
}

impl From<EngineError> for Failure {
    fn from(e: EngineError) -> Self {
        let status = match &e {
            EngineError::Spec(_) => StatusCode::UNPROCESSABLE_ENTITY,
            EngineError::NoSuchJob(_) => StatusCode::NOT_FOUND,
            EngineError::NotOwner { .. } => StatusCode::FORBIDDEN,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let spec_error = if let EngineError::Spec(s) = &e { Some(s.clone()) } else { None };
        Failure(status, ApiError { error: e.to_string(), spec_error })
    }
}


type E = State<Arc<Engine>>;
type Res<T> = Result<Json<T>, Failure>;

pub fn router(engine: Arc<Engine>) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/jobs", get(queue).post(submit))
        .route("/v1/jobs/{id}", get(job))
        .route("/v1/jobs/{id}/cancel", post(cancel))
        .route("/v1/jobs/{id}/priority", post(priority))
        .route("/v1/jobs/{id}/logs", get(logs))
        .route("/v1/gpus", get(gpus))
        .route("/v1/history", get(history))
        .route("/v1/history/count", get(history_count))
        .route("/v1/timeline", get(timeline))
        .route("/v1/gpus/recent", get(gpus_recent))
        .route("/v1/gpus/{index}/minutes", get(gpu_minutes))
        .route("/v1/validate", post(validate))
        .route("/v1/jobs/{id}/rerun", post(rerun))
        .route("/v1/whoami", get(whoami))
        .route("/v1/events", get(events))
        .with_state(engine)
}

async fn status(State(e): E) -> Json<StatusInfo> {
    let g = e.gpu_status();
    Json(StatusInfo {
        version: env!("CARGO_PKG_VERSION").into(),
        pid: std::process::id(),
        gpu_backend: g.backend,
        gpu_note: g.note,
        gpu_count: g.gpus.len(),
        inbox: e.cfg.paths.inbox.clone(),
        state_dir: e.cfg.paths.state_dir.clone(),
        docker_problem: e.docker_problem(),
        engine_id: e.engine_id.clone(),
    })
}

async fn submit(State(e): E, ConnectInfo(p): ConnectInfo<Peer>, Json(r): Json<SubmitRequest>) -> Res<Submitted> {
    let format = Format::from_name(&r.file_name).ok_or_else(|| {
        Failure(StatusCode::UNPROCESSABLE_ENTITY, ApiError {
            error: format!("{:?} is not a job file: Gantry reads .yaml, .yml and .toml", r.file_name),
            spec_error: None,
        })
    })?;
    let owner = owner_of(&p);
    let origin = Origin { file_name: Some(r.file_name.clone()), base_dir: r.base_dir.clone() };
    let ids = e.submit_text(&r.text, format, &origin, &owner, &format!("api:{}", r.file_name))?;
    Ok(Json(Submitted::of(ids)))
}

async fn queue(State(e): E) -> Res<Vec<crate::engine::QueueEntry>> {
    Ok(Json(e.queue()?))
}

async fn job(State(e): E, UrlPath(id): UrlPath<i64>) -> Res<crate::engine::JobDetail> {
    Ok(Json(e.job_detail(id)?))
}

async fn cancel(State(e): E, ConnectInfo(p): ConnectInfo<Peer>, UrlPath(id): UrlPath<i64>) -> Res<JobState> {
    Ok(Json(e.cancel(id, p.uid)?))
}

async fn priority(State(e): E, ConnectInfo(p): ConnectInfo<Peer>, UrlPath(id): UrlPath<i64>, Json(r): Json<PriorityRequest>) -> Res<bool> {
    Ok(Json(e.set_priority(id, r.priority, p.uid)?))
}

async fn gpus(State(e): E) -> Json<crate::engine::GpuStatus> {
    Json(e.gpu_status())
}

async fn history(State(e): E, Query(f): Query<HistoryFilter>) -> Res<Vec<crate::store::HistoryRow>> {
    Ok(Json(e.history(&f)?))
}

async fn history_count(State(e): E, Query(f): Query<HistoryFilter>) -> Res<i64> {
    Ok(Json(e.history_count(&f)?))
}

async fn timeline(State(e): E, Query(r): Query<Range>) -> Res<Vec<crate::store::TimelineRun>> {
    Ok(Json(e.timeline(r.from, r.to)?))
}

#[derive(Deserialize)]
struct Since {
    #[serde(default)]
    since: i64,
}

/// 1 Hz samples of the last hour: `[ms, [[util, mem_used], ...]]`.
async fn gpus_recent(State(e): E, Query(q): Query<Since>) -> Json<Vec<(i64, Vec<(u32, u64)>)>> {
    Json(e.recent_samples(q.since))
}

async fn gpu_minutes(State(e): E, UrlPath(index): UrlPath<u32>, Query(r): Query<Range>) -> Res<Vec<(i64, f64, i64)>> {
    Ok(Json(e.gpu_minutes(index, r.from, r.to)?))
}

fn owner_of(p: &Peer) -> Owner {
    Owner { uid: p.uid, gid: p.gid, name: user_name(p.uid) }
}

/// Check a spec without queueing it (the app's submit preview).
async fn validate(State(e): E, Json(r): Json<SubmitRequest>) -> Res<crate::spec::ValidJob> {
    let format = Format::from_name(&r.file_name).ok_or_else(|| {
        Failure(StatusCode::UNPROCESSABLE_ENTITY, ApiError {
            error: format!("{:?} is not a job file: Gantry reads .yaml, .yml and .toml", r.file_name),
            spec_error: None,
        })
    })?;
    let origin = Origin { file_name: Some(r.file_name.clone()), base_dir: r.base_dir.clone() };
    Ok(Json(e.validate_text(&r.text, format, &origin)?))
}

/// Queue a copy of a job's spec, owned by the caller.
async fn rerun(State(e): E, ConnectInfo(p): ConnectInfo<Peer>, UrlPath(id): UrlPath<i64>) -> Res<Submitted> {
    Ok(Json(Submitted::of(e.rerun(id, &owner_of(&p))?)))
}

async fn whoami(ConnectInfo(p): ConnectInfo<Peer>) -> Json<WhoAmI> {
    Json(WhoAmI { uid: p.uid, name: user_name(p.uid) })
}

#[derive(Deserialize)]
struct LogQuery {
    #[serde(default)]
    follow: bool,
}

/// The job's log file; with `follow`, keep streaming until the job has ended.
async fn logs(State(e): E, UrlPath(id): UrlPath<i64>, Query(q): Query<LogQuery>) -> Result<Response, Failure> {
    e.job_detail(id)?;
    let path = e.log_of(id);
    if !q.follow {
        let bytes = tokio::fs::read(&path).await.unwrap_or_default();
        return Ok(bytes.into_response());
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(16);
    tokio::spawn(async move {
        let mut offset = 0u64;
        loop {
            let ended = e.job_detail(id).map(|d| d.job.state.is_final()).unwrap_or(true);
            if let Ok(data) = read_from(&path, offset).await {
                if !data.is_empty() {
                    offset += data.len() as u64;
                    if tx.send(Ok(data)).await.is_err() {
                        return;
                    }
                    continue;
                }
            }
            if ended {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    Ok(Body::from_stream(tokio_stream_from(rx)).into_response())
}

async fn read_from(path: &Path, offset: u64) -> std::io::Result<Vec<u8>> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let mut f = tokio::fs::File::open(path).await?;
    f.seek(std::io::SeekFrom::Start(offset)).await?;
    let mut buf = Vec::new();
    (&mut f).take(1 << 20).read_to_end(&mut buf).await?;
    Ok(buf)
}

fn tokio_stream_from<T: Send + 'static>(mut rx: tokio::sync::mpsc::Receiver<T>) -> impl futures_util::Stream<Item = T> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// State changes and GPU samples as newline-delimited JSON.
async fn events(State(e): E) -> Response {
    let mut sub = e.subscribe();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(64);
    tokio::spawn(async move {
        loop {
            match sub.recv().await {
                Ok(ev) => {
                    let mut line = serde_json::to_vec(&ev).unwrap_or_default();
                    line.push(b'\n');
                    if tx.send(Ok(line)).await.is_err() {
                        return;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(_) => return,
            }
        }
    });
    Body::from_stream(tokio_stream_from(rx)).into_response()
}

/// Bind the socket (refusing if another engine answers on it) and serve until `shutdown`.
pub async fn serve(engine: Arc<Engine>, socket: &Path, shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> Result<(), EngineError> {
    if socket.exists() {
        if UnixStream::connect(socket).await.is_ok() {
            return Err(EngineError::AlreadyRunning(socket.to_path_buf()));
        }
        std::fs::remove_file(socket)?; // stale socket from an engine that died
    }
    let listener = UnixListener::bind(socket)?;
    {
        use std::os::unix::fs::PermissionsExt;
        // Every local user may connect; what they may do is decided by their peer credentials.
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666))?;
    }
    tracing::info!("API listening on {}", socket.display());
    let stopping = tokio_util::sync::CancellationToken::new();
    let stop = stopping.clone();
    let served = axum::serve(listener, router(engine).into_make_service_with_connect_info::<Peer>()).with_graceful_shutdown(async move {
        shutdown.await;
        stop.cancel();
    });
    // Streams (`logs -f`, the app's live events) never end on their own: give requests 2 s, then go.
    tokio::select! {
        r = served => r?,
        _ = async { stopping.cancelled().await; tokio::time::sleep(Duration::from_secs(2)).await } => {
            tracing::info!("closing remaining API connections");
        }
    }
    Ok(())
}
