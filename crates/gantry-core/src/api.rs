//! The engine's local API: HTTP+JSON on a Unix socket. The caller's identity is the socket's peer
//! credentials (uid/gid), never something the client claims.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::engine::submit::{Spec, Submission};
use crate::engine::{Engine, EngineError};
use crate::inbox::user_name;
use crate::inbox::users::Registry;
use crate::notify::{Notifier, NotifyError};
use crate::protocol::routes::{
    ATTACH, BOOKINGS, BOOKING_CANCEL, CANCEL, COMPARE, EVENTS, GPUS, GPUS_RECENT, GPU_MINUTES, HISTORY, HISTORY_COUNT,
    HOLD, INBOX, JOB, JOBS, LOGS, NOTIFY, NOTIFY_LOG, NOTIFY_REMOVE, NOTIFY_TEST, OPEN, PREVIEW, PRIORITY, QUEUE_PAGE,
    RELEASE, RERUN, RESULTS, STATUS, TIMELINE, USAGE, USAGE_CHARTS, VALIDATE, WHOAMI,
};
use crate::protocol::{
    ApiError, Attempt, Event, GpuMinute, GpuStatus, HistoryFilter, HistoryRow, InboxInfo, JobDetailView, JobState,
    JobView, LogQuery, PriorityRequest, QueuePageQuery, Range, RecentSample, Since, StatusInfo, SubmitRequest,
    Submitted, TimelineRun, UsageQuery, UsageReport, WhoAmI,
};
use crate::protocol::{NotifyAdd, NotifyDelivery, NotifyLogQuery, Subscription, UsageCharts, UsageChartsQuery};
use crate::spec::ValidJob;
use crate::store::{Job, Owner};

/// Who is calling, from SO_PEERCRED.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
}

impl Peer {
    fn of(stream: &UnixStream) -> Peer {
        let cred = stream.peer_cred().ok();
        // No credentials: treat as "nobody", which owns nothing.
        Peer {
            uid: cred.map(|c| c.uid()).unwrap_or(NOBODY),
            gid: cred.map(|c| c.gid()).unwrap_or(NOBODY),
        }
    }
}

const NOBODY: u32 = 65534;

/// Who is asking, and whether the lab policy lets them see other users' private parts: a job's spec
/// (command, env, mounts, workdir), its free-text messages and its output
/// ([`crate::policy::Policy::may_see_private`] is the rule). Rows (id, name, owner, image,
/// resources, state, times, exit code) are public on a shared machine.
#[derive(Debug, Clone, Copy)]
pub struct Viewer {
    pub uid: u32,
    pub sees_everyones: bool,
}

impl Viewer {
    pub fn of(policy: &crate::policy::Policy, uid: u32) -> Viewer {
        Viewer {
            uid,
            sees_everyones: policy.sees_everyones(uid),
        }
    }
    pub fn may_see_private(&self, owner: u32) -> bool {
        self.sees_everyones || self.uid == owner
    }
}

impl JobView {
    /// `j` as `viewer` may see it.
    pub fn new(j: Job, viewer: Viewer) -> JobView {
        // Destructured field by field: a new `Job` field does not compile until someone decides
        // whether it is public.
        let Job {
            id,
            name,
            owner_uid,
            owner_gid,
            owner,
            image,
            gpus,
            gpu_memory,
            priority,
            retries,
            timeout_ms,
            job,
            state,
            source,
            submitted_at,
            not_before,
            started_at,
            finished_at,
            exit_code,
            attempts,
            cancel_requested,
            message,
        } = j;
        let shown = viewer.may_see_private(owner_uid);
        JobView {
            id,
            name,
            owner_uid,
            owner_gid,
            owner,
            image,
            gpus,
            gpu_memory,
            priority,
            retries,
            timeout_ms,
            job: shown.then_some(job),
            spec_hidden: !shown,
            state,
            source,
            submitted_at,
            not_before,
            started_at,
            finished_at,
            exit_code,
            attempts,
            cancel_requested,
            message: message.filter(|_| shown),
        }
    }
}

impl JobDetailView {
    fn new(d: crate::engine::JobDetail, viewer: Viewer) -> JobDetailView {
        let shown = viewer.may_see_private(d.job.owner_uid);
        JobDetailView {
            job: JobView::new(d.job, viewer),
            attempts: d
                .attempts
                .into_iter()
                .map(|a| Attempt {
                    message: a.message.filter(|_| shown),
                    ..a
                })
                .collect(),
            events: d
                .events
                .into_iter()
                .map(|e| Event {
                    message: e.message.filter(|_| shown),
                    ..e
                })
                .collect(),
            reason: d.reason,
        }
    }
}

pub use crate::config::ApiLimits as Limits;

/// On shutdown, requests in flight get this long; streams (`logs -f`, the app's events) never end
/// on their own, so they are cut after it.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// After a failed accept (e.g. EMFILE), wait this long instead of spinning on the error.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

struct Failure(StatusCode, ApiError);

impl Failure {
    fn forbidden(error: String) -> Failure {
        Failure(
            StatusCode::FORBIDDEN,
            ApiError {
                error,
                spec_error: None,
            },
        )
    }
}

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
            EngineError::BadQuery(_) => StatusCode::BAD_REQUEST,
            EngineError::NotOwner { .. } => StatusCode::FORBIDDEN,
            EngineError::NoSuchBooking(_) => StatusCode::NOT_FOUND,
            EngineError::NotBookingOwner { .. } => StatusCode::FORBIDDEN,
            EngineError::BookingRefused(_) => StatusCode::UNPROCESSABLE_ENTITY,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let spec_error = if let EngineError::Spec(s) = &e {
            Some(s.clone())
        } else {
            None
        };
        Failure(
            status,
            ApiError {
                error: e.to_string(),
                spec_error,
            },
        )
    }
}

type E = State<Arc<Engine>>;
type Res<T> = Result<Json<T>, Failure>;

pub fn router(engine: Arc<Engine>, inboxes: Arc<Registry>, notifier: Arc<Notifier>) -> Router {
    Router::new()
        .route(STATUS, get(status))
        .route(JOBS, get(queue).post(submit))
        .route(QUEUE_PAGE, get(queue_page))
        .route(JOB, get(job))
        .route(CANCEL, post(cancel))
        .route(PRIORITY, post(priority))
        .route(HOLD, post(hold))
        .route(RELEASE, post(release))
        .route(LOGS, get(logs))
        .route(RESULTS, get(results))
        .route(COMPARE, get(compare))
        .route(ATTACH, get(attach))
        .route(OPEN, post(open_port))
        .route(GPUS, get(gpus))
        .route(HISTORY, get(history))
        .route(HISTORY_COUNT, get(history_count))
        .route(TIMELINE, get(timeline))
        .route(GPUS_RECENT, get(gpus_recent))
        .route(GPU_MINUTES, get(gpu_minutes))
        .route(VALIDATE, post(validate))
        .route(PREVIEW, post(preview))
        .route(RERUN, post(rerun))
        .route(WHOAMI, get(whoami))
        .route(INBOX, get(inbox).post(inbox_init))
        .route(EVENTS, get(events))
        .route(USAGE, get(usage))
        .route(USAGE_CHARTS, get(usage_charts))
        .route(BOOKINGS, get(bookings_list).post(book))
        .route(BOOKING_CANCEL, post(booking_cancel))
        .route(NOTIFY, get(notify_list).post(notify_add))
        .route(NOTIFY_REMOVE, post(notify_remove))
        .route(NOTIFY_TEST, post(notify_test))
        .route(NOTIFY_LOG, get(notify_log))
        .layer(Extension(inboxes))
        .layer(Extension(notifier))
        .layer(Extension(Arc::new(LogStreams::default())))
        .with_state(engine)
}

async fn status(
    State(e): E,
    Extension(inboxes): Extension<Arc<Registry>>,
    ConnectInfo(p): ConnectInfo<Peer>,
) -> Json<StatusInfo> {
    let g = e.gpu_status();
    let h = e.health();
    Json(StatusInfo {
        version: env!("CARGO_PKG_VERSION").into(),
        pid: std::process::id(),
        gpu_backend: g.backend,
        gpu_note: g.note,
        gpu_library: g.library,
        gpu_count: g.gpus.len(),
        inbox: inboxes.info(&e, p.uid).path,
        state_dir: e.cfg.paths.state_dir.clone(),
        system: e.cfg.paths.system_root.is_some(),
        backend_problem: h.backend_problem,
        store_problem: h.store_problem,
        orphans: h.orphans,
        disk_problem: h.disk_problem,
        disk_note: h.disk_note,
        engine_id: e.engine_id.clone(),
        reserved_gpus: e.reserved_gpus(),
        config_file: e.lab_file().map(Path::to_path_buf),
        notebook_image: e.policy().sessions.notebook_image.clone(),
    })
}

async fn submit(State(e): E, ConnectInfo(p): ConnectInfo<Peer>, Json(r): Json<SubmitRequest>) -> Res<Submitted> {
    let owner = owner_of(&p);
    // Mounts are checked by helper processes that may wait on a slow file system: off the async workers.
    let ids = tokio::task::spawn_blocking(move || {
        let spec = Spec::File {
            text: &r.text,
            file_name: &r.file_name,
            base_dir: r.base_dir.clone(),
            begin: r.begin.as_deref(),
        };
        e.submit(Submission {
            spec,
            owner: &owner,
            source: r.origin.source(&r.file_name),
            source_key: None,
            idempotency_key: r.idempotency_key.as_deref(),
        })
    })
    .await
    .map_err(|err| EngineError::Fatal(format!("submit crashed: {err}")))??;
    Ok(Json(Submitted::of(ids)))
}

/// Everyone's queue rows ([`crate::protocol::QueueEntryView`]s): a [`crate::protocol::QueueJob`] holds only public
/// fields, so every caller gets the same list (no spec, env, messages or output to hide). Written
/// by the engine straight from the queue in memory (a deep queue is tens of MB of JSON).
async fn queue(State(e): E) -> Result<Response, Failure> {
    let body = tokio::task::spawn_blocking(move || e.queue_json())
        .await
        .map_err(|err| EngineError::Fatal(format!("listing the queue crashed: {err}")))??;
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// `gantry ls`'s page of the queue: public rows only, as [`queue`]; the caller's own jobs among them.
async fn queue_page(
    State(e): E,
    ConnectInfo(p): ConnectInfo<Peer>,
    Query(q): Query<QueuePageQuery>,
) -> Result<Response, Failure> {
    let body = tokio::task::spawn_blocking(move || e.queue_page_json(q.limit, p.uid))
        .await
        .map_err(|err| EngineError::Fatal(format!("listing the queue crashed: {err}")))??;
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response())
}

async fn job(State(e): E, ConnectInfo(p): ConnectInfo<Peer>, UrlPath(id): UrlPath<i64>) -> Res<JobDetailView> {
    Ok(Json(JobDetailView::new(
        e.job_detail(id)?,
        Viewer::of(&e.policy(), p.uid),
    )))
}

async fn cancel(State(e): E, ConnectInfo(p): ConnectInfo<Peer>, UrlPath(id): UrlPath<i64>) -> Res<JobState> {
    Ok(Json(e.cancel(id, p.uid)?))
}

async fn priority(
    State(e): E,
    ConnectInfo(p): ConnectInfo<Peer>,
    UrlPath(id): UrlPath<i64>,
    Json(r): Json<PriorityRequest>,
) -> Res<bool> {
    Ok(Json(e.set_priority(id, r.priority, p.uid)?))
}

/// `true` when the job was queued and not held yet; `false` when it is not queued or already held.
async fn hold(State(e): E, ConnectInfo(p): ConnectInfo<Peer>, UrlPath(id): UrlPath<i64>) -> Res<bool> {
    Ok(Json(e.hold(id, true, p.uid)?))
}

async fn release(State(e): E, ConnectInfo(p): ConnectInfo<Peer>, UrlPath(id): UrlPath<i64>) -> Res<bool> {
    Ok(Json(e.hold(id, false, p.uid)?))
}

async fn gpus(State(e): E) -> Json<GpuStatus> {
    Json(e.gpu_status())
}

async fn history(
    State(e): E,
    ConnectInfo(p): ConnectInfo<Peer>,
    Query(f): Query<HistoryFilter>,
) -> Res<Vec<HistoryRow>> {
    let mut rows = e.history(&f)?;
    // `--metric M`: its last value on the caller's own runs (everyone's for admins), like logs.
    if let Some(m) = f.metric.as_deref().filter(|m| !m.is_empty()) {
        let policy = e.policy();
        let mut uids: HashMap<&str, u32> = HashMap::new();
        let ids: Vec<i64> = rows
            .iter()
            .filter(|r| {
                let owner = *uids.entry(r.owner.as_str()).or_insert_with(|| uid_of(&r.owner));
                policy.may_see_private(p.uid, owner)
            })
            .map(|r| r.id)
            .collect();
        let last = e.last_metric(&ids, m)?;
        for r in &mut rows {
            r.metric = last.get(&r.id).copied().map(crate::protocol::Num);
        }
    }
    Ok(Json(rows))
}

/// A user's uid by name (`u32::MAX`, nobody's, when unknown).
fn uid_of(name: &str) -> u32 {
    nix::unistd::User::from_name(name)
        .ok()
        .flatten()
        .map_or(u32::MAX, |u| u.uid.as_raw())
}

/// A job's metrics, params and tags: its owner and admins only, like its output.
async fn results(
    State(e): E,
    ConnectInfo(p): ConnectInfo<Peer>,
    UrlPath(id): UrlPath<i64>,
    Query(q): Query<crate::protocol::ResultsQuery>,
) -> Res<crate::protocol::JobResults> {
    let job = e.job_detail(id)?.job;
    if !e.policy().may_see_private(p.uid, job.owner_uid) {
        return Err(Failure::forbidden(format!(
            "job {id} belongs to {}; only its owner or an admin can read its results",
            job.owner
        )));
    }
    let r = tokio::task::spawn_blocking(move || e.job_results(id, q.max_points))
        .await
        .map_err(|err| EngineError::Fatal(format!("reading results crashed: {err}")))??;
    Ok(Json(r))
}

/// Runs side by side; another user's runs show without params or metrics.
async fn compare(
    State(e): E,
    ConnectInfo(p): ConnectInfo<Peer>,
    Query(q): Query<crate::protocol::CompareQuery>,
) -> Res<crate::protocol::Comparison> {
    let r = tokio::task::spawn_blocking(move || e.compare(p.uid, &q))
        .await
        .map_err(|err| EngineError::Fatal(format!("comparing crashed: {err}")))??;
    Ok(Json(r))
}

async fn history_count(State(e): E, Query(f): Query<HistoryFilter>) -> Res<i64> {
    Ok(Json(e.history_count(&f)?))
}

async fn timeline(State(e): E, Query(r): Query<Range>) -> Res<Vec<TimelineRun>> {
    Ok(Json(e.timeline(r.from, r.to)?))
}

/// Per-user GPU-hours, jobs, mean wait and fair-share usage: everyone may see them (they are the
/// numbers fair share orders the queue by).
async fn usage(State(e): E, Query(q): Query<UsageQuery>) -> Res<UsageReport> {
    Ok(Json(e.usage(q.since_ms)?))
}

/// GPU-hours per user per day and GPU utilization by hour of day since `since_ms` (public, like `usage`).
async fn usage_charts(State(e): E, Query(q): Query<UsageChartsQuery>) -> Res<UsageCharts> {
    let r = tokio::task::spawn_blocking(move || e.usage_charts(q.since_ms, q.bucket_ms, q.tz_offset_min))
        .await
        .map_err(|err| EngineError::Fatal(format!("usage charts crashed: {err}")))??;
    Ok(Json(r))
}

impl From<NotifyError> for Failure {
    fn from(e: NotifyError) -> Self {
        match e {
            NotifyError::Refused(m) => Failure(
                StatusCode::UNPROCESSABLE_ENTITY,
                ApiError {
                    error: m,
                    spec_error: None,
                },
            ),
            NotifyError::Forbidden(m) => Failure::forbidden(m),
            NotifyError::Engine(e) => e.into(),
            NotifyError::Store(e) => EngineError::Store(e).into(),
        }
    }
}

type N = Extension<Arc<Notifier>>;

/// The caller's notification targets (and the lab's webhooks, which everyone may see).
async fn notify_list(Extension(n): N, ConnectInfo(p): ConnectInfo<Peer>) -> Res<Vec<Subscription>> {
    Ok(Json(
        tokio::task::spawn_blocking(move || n.list(p.uid))
            .await
            .map_err(|err| EngineError::Fatal(format!("notify ls crashed: {err}")))??,
    ))
}

/// Subscribe the caller (never anyone else: the target is theirs, and only their jobs reach it).
async fn bookings_list(
    State(e): E,
    ConnectInfo(p): ConnectInfo<Peer>,
    Query(q): Query<crate::protocol::BookingsQuery>,
) -> Res<crate::protocol::Bookings> {
    Ok(Json(
        tokio::task::spawn_blocking(move || e.bookings(p.uid, &q))
            .await
            .map_err(|err| EngineError::Fatal(format!("bookings crashed: {err}")))??,
    ))
}

async fn book(
    State(e): E,
    ConnectInfo(p): ConnectInfo<Peer>,
    Json(r): Json<crate::protocol::BookRequest>,
) -> Res<crate::protocol::BookingView> {
    Ok(Json(
        tokio::task::spawn_blocking(move || e.book(p.uid, &user_name(p.uid), r))
            .await
            .map_err(|err| EngineError::Fatal(format!("book crashed: {err}")))??,
    ))
}

async fn booking_cancel(
    State(e): E,
    ConnectInfo(p): ConnectInfo<Peer>,
    UrlPath(id): UrlPath<i64>,
) -> Res<crate::protocol::BookingView> {
    Ok(Json(
        tokio::task::spawn_blocking(move || e.cancel_booking(p.uid, id))
            .await
            .map_err(|err| EngineError::Fatal(format!("book cancel crashed: {err}")))??,
    ))
}

async fn notify_add(
    State(e): E,
    Extension(n): N,
    ConnectInfo(p): ConnectInfo<Peer>,
    Json(r): Json<NotifyAdd>,
) -> Res<Subscription> {
    Ok(Json(n.add(&e, p.uid, &user_name(p.uid), r).await?))
}

async fn notify_remove(Extension(n): N, ConnectInfo(p): ConnectInfo<Peer>, UrlPath(id): UrlPath<i64>) -> Res<bool> {
    Ok(Json(
        tokio::task::spawn_blocking(move || n.remove(p.uid, id))
            .await
            .map_err(|err| EngineError::Fatal(format!("notify rm crashed: {err}")))??,
    ))
}

async fn notify_test(Extension(n): N, ConnectInfo(p): ConnectInfo<Peer>) -> Res<Vec<NotifyDelivery>> {
    Ok(Json(
        tokio::task::spawn_blocking(move || n.test(p.uid, &user_name(p.uid)))
            .await
            .map_err(|err| EngineError::Fatal(format!("notify test crashed: {err}")))??,
    ))
}

async fn notify_log(
    Extension(n): N,
    ConnectInfo(p): ConnectInfo<Peer>,
    Query(q): Query<NotifyLogQuery>,
) -> Res<Vec<NotifyDelivery>> {
    let limit = q.limit.unwrap_or(50).clamp(1, 1000) as usize;
    Ok(Json(
        tokio::task::spawn_blocking(move || n.log(p.uid, limit))
            .await
            .map_err(|err| EngineError::Fatal(format!("notify log crashed: {err}")))??,
    ))
}

/// 1 Hz samples of the last hour: `[ms, [[util, mem_used], ...]]`.
async fn gpus_recent(State(e): E, Query(q): Query<Since>) -> Json<Vec<RecentSample>> {
    Json(
        e.recent_samples(q.since)
            .into_iter()
            .map(|(at, gpus)| RecentSample(at, gpus))
            .collect(),
    )
}

async fn gpu_minutes(State(e): E, UrlPath(index): UrlPath<u32>, Query(r): Query<Range>) -> Res<Vec<GpuMinute>> {
    Ok(Json(
        e.gpu_minutes(index, r.from, r.to)?
            .into_iter()
            .map(|(at, util, mem)| GpuMinute(at, util, mem))
            .collect(),
    ))
}

fn owner_of(p: &Peer) -> Owner {
    // The user's own primary group, not the connecting process's (a setgid program's group is not theirs).
    Owner {
        uid: p.uid,
        gid: crate::access::primary_gid(p.uid, p.gid),
        name: user_name(p.uid),
    }
}

/// Check a spec without queueing it (the app's submit preview).
async fn validate(State(e): E, Json(r): Json<SubmitRequest>) -> Res<ValidJob> {
    Ok(Json(e.validate_file(&r.text, &r.file_name, r.base_dir)?))
}

/// A dry run of `submit`, as the caller (mounts checked as them, their limits): nothing queued.
async fn preview(
    State(e): E,
    ConnectInfo(p): ConnectInfo<Peer>,
    Json(r): Json<SubmitRequest>,
) -> Res<crate::protocol::SubmitPreview> {
    let owner = owner_of(&p);
    // Mounts are checked by helper processes, as in `submit`: off the async workers.
    let out = tokio::task::spawn_blocking(move || {
        e.preview(&r.text, &r.file_name, r.base_dir.clone(), r.begin.as_deref(), &owner)
    })
    .await
    .map_err(|err| EngineError::Fatal(format!("the dry run crashed: {err}")))??;
    Ok(Json(out))
}

/// Queue a copy of a job's spec. Only the job's owner (or an admin) may: the copy carries the spec's
/// env and mounts, which are the owner's, and it runs as the owner.
async fn rerun(State(e): E, ConnectInfo(p): ConnectInfo<Peer>, UrlPath(id): UrlPath<i64>) -> Res<Submitted> {
    let job = e.job_detail(id)?.job;
    if p.uid != job.owner_uid && !e.policy().is_admin(p.uid) {
        return Err(Failure::forbidden(format!(
            "job {id} belongs to {}; only its owner or an admin can run it again",
            job.owner
        )));
    }
    let owner = owner_of(&p);
    let ids = tokio::task::spawn_blocking(move || {
        e.submit(Submission {
            spec: Spec::Rerun(id),
            owner: &owner,
            source: format!("rerun:{id}"),
            source_key: None,
            idempotency_key: None,
        })
    })
    .await
    .map_err(|err| EngineError::Fatal(format!("rerun crashed: {err}")))??;
    Ok(Json(Submitted::of(ids)))
}

/// The caller's drop folder and whether the engine watches it.
async fn inbox(
    State(e): E,
    Extension(inboxes): Extension<Arc<Registry>>,
    ConnectInfo(p): ConnectInfo<Peer>,
) -> Json<InboxInfo> {
    Json(inboxes.info(&e, p.uid))
}

/// `gantry inbox init`: the caller made their drop folder (as themselves); watch it from now on.
async fn inbox_init(
    State(e): E,
    Extension(inboxes): Extension<Arc<Registry>>,
    ConnectInfo(p): ConnectInfo<Peer>,
) -> Res<InboxInfo> {
    let info = tokio::task::spawn_blocking(move || inboxes.register(&e, p.uid))
        .await
        .map_err(|err| EngineError::Fatal(format!("inbox init crashed: {err}")))??;
    Ok(Json(info))
}

async fn whoami(ConnectInfo(p): ConnectInfo<Peer>) -> Json<WhoAmI> {
    Json(WhoAmI {
        uid: p.uid,
        name: user_name(p.uid),
    })
}

/// The job's log file, streamed: read a chunk at a time as the socket drains (never the whole
/// file per reader); with `follow`, until the job has ended. Each uid has at most the lab's
/// `[logs] streams_per_user` streams open; one more is refused, saying so.
async fn logs(
    State(e): E,
    Extension(streams): Extension<Arc<LogStreams>>,
    ConnectInfo(p): ConnectInfo<Peer>,
    UrlPath(id): UrlPath<i64>,
    Query(q): Query<LogQuery>,
) -> Result<Response, Failure> {
    let job = e.job_detail(id)?.job;
    if !e.policy().may_see_private(p.uid, job.owner_uid) {
        return Err(Failure::forbidden(format!(
            "job {id} belongs to {}; only its owner or an admin can read its output",
            job.owner
        )));
    }
    let slot = streams.open(p.uid, e.policy().log_streams_per_user).map_err(|open| {
        let set = match e.lab_file() {
            Some(f) => format!("`[logs] streams_per_user` in {}", f.display()),
            None => "the default; a lab config's `[logs] streams_per_user` sets it".into(),
        };
        let error = format!(
            "{} has {open} log streams open (`gantry logs`, `logs -f`, the app's log views), the most one user may have ({set}); close one and try again",
            user_name(p.uid)
        );
        Failure(StatusCode::TOO_MANY_REQUESTS, ApiError { error, spec_error: None })
    })?;
    let path = e.log_of(id);
    // One chunk in the channel and one being read: with hyper's own bounded write buffer, what a
    // slow reader pins is a few chunks, not the log.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let _slot = slot;
        let mut reader = crate::engine::LogReader::default();
        let mut buf = vec![0u8; LOG_CHUNK];
        let mut file: Option<tokio::fs::File> = None;
        loop {
            let ended = !q.follow || e.job_detail(id).map(|d| d.job.state.is_final()).unwrap_or(true);
            if file.is_none() {
                file = tokio::fs::File::open(&path).await.ok();
            }
            // Read to the end, a chunk per send: a send waits until the reader took the last one.
            while let Some(f) = file.as_mut() {
                let n = match f.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let out = reader.feed(&buf[..n]);
                if !out.is_empty() && tx.send(Ok(out)).await.is_err() {
                    return;
                }
            }
            let out = if ended { reader.finish() } else { reader.caught_up() };
            if !out.is_empty() && tx.send(Ok(out)).await.is_err() {
                return;
            }
            if ended {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = tx.closed() => return,
            }
        }
    });
    Ok(Body::from_stream(tokio_stream_from(rx)).into_response())
}

/// How much of a log one stream reads at a time.
const LOG_CHUNK: usize = 32 << 10;

/// Open log streams per uid (see [`logs`]).
#[derive(Default)]
pub struct LogStreams(Mutex<HashMap<u32, usize>>);

/// One open log stream; frees its place when dropped (the stream ended or its reader went away).
struct StreamSlot {
    streams: Arc<LogStreams>,
    uid: u32,
}

impl LogStreams {
    /// A place for one more stream of `uid`, or how many it has open (`cap` of them).
    fn open(self: &Arc<Self>, uid: u32, cap: usize) -> Result<StreamSlot, usize> {
        let mut open = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mine = open.entry(uid).or_default();
        if *mine >= cap {
            return Err(*mine);
        }
        *mine += 1;
        Ok(StreamSlot {
            streams: self.clone(),
            uid,
        })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.streams.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.uid);
            }
        }
    }
}

/// A session's terminal: checked (the caller's own running session), its TTY attached, then the
/// connection is upgraded and carries [`crate::protocol::terminal`] frames both ways.
async fn attach(
    State(e): E,
    ConnectInfo(p): ConnectInfo<Peer>,
    UrlPath(id): UrlPath<i64>,
    mut req: axum::extract::Request,
) -> Result<Response, Failure> {
    use crate::engine::session::AttachError;
    use crate::protocol::terminal::UPGRADE;
    let asked = req
        .headers()
        .get(axum::http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        == Some(UPGRADE);
    if !asked {
        let error = format!("this route is a terminal: ask for `Upgrade: {UPGRADE}` (`gantry attach {id}` does)");
        return Err(Failure(
            StatusCode::UPGRADE_REQUIRED,
            ApiError {
                error,
                spec_error: None,
            },
        ));
    }
    let fail = |status, e: AttachError| {
        Failure(
            status,
            ApiError {
                error: e.to_string(),
                spec_error: None,
            },
        )
    };
    let s = e.attachable(id, p.uid).map_err(|err| match err {
        AttachError::NotOwner { .. } => fail(StatusCode::FORBIDDEN, err),
        AttachError::NotASession(_) | AttachError::NotRunning { .. } => fail(StatusCode::CONFLICT, err),
        AttachError::Engine(err) => Failure::from(err),
    })?;
    let slot = crate::engine::session::TerminalSlot::take(p.uid).map_err(|why| {
        Failure(
            StatusCode::TOO_MANY_REQUESTS,
            ApiError {
                error: why,
                spec_error: None,
            },
        )
    })?;
    let on_upgrade = hyper::upgrade::on(&mut req);
    let term = e.open_terminal(&s).await?;
    tokio::spawn(async move {
        let _slot = slot;
        match on_upgrade.await {
            Ok(upgraded) => e.serve_terminal(s, term, TokioIo::new(upgraded)).await,
            Err(err) => debug!(uid = p.uid, "a terminal connection was not upgraded: {err}"),
        }
    });
    Ok(Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(axum::http::header::CONNECTION, "upgrade")
        .header(axum::http::header::UPGRADE, UPGRADE)
        .body(Body::empty())
        .expect("a valid response"))
}

/// A loopback URL reaching one of the caller's job's `ports` (see `engine::ports`).
async fn open_port(
    State(e): E,
    ConnectInfo(p): ConnectInfo<Peer>,
    UrlPath(id): UrlPath<i64>,
    Json(r): Json<crate::protocol::terminal::OpenRequest>,
) -> Res<crate::protocol::terminal::Opened> {
    use crate::engine::ports::OpenError;
    let fail = |status, e: OpenError| {
        Failure(
            status,
            ApiError {
                error: e.to_string(),
                spec_error: None,
            },
        )
    };
    e.open_port(id, p.uid, r.port).await.map(Json).map_err(|err| match err {
        OpenError::NotOwner { .. } => fail(StatusCode::FORBIDDEN, err),
        OpenError::NoPorts(_) | OpenError::NotServed { .. } | OpenError::NotRunning { .. } => {
            fail(StatusCode::CONFLICT, err)
        }
        OpenError::Taken { .. } => fail(StatusCode::SERVICE_UNAVAILABLE, err),
        OpenError::Engine(err) => Failure::from(err),
    })
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
pub async fn serve(
    engine: Arc<Engine>,
    inboxes: Arc<Registry>,
    notifier: Arc<Notifier>,
    socket: &Path,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), EngineError> {
    if socket.exists() {
        if UnixStream::connect(socket).await.is_ok() {
            return Err(EngineError::AlreadyRunning(socket.to_path_buf()));
        }
        std::fs::remove_file(socket)?; // stale socket from an engine that died
    }
    // `/run/gantry` is on tmpfs (gone after a reboot): create it, and let every user reach the socket.
    if let Some(dir) = socket.parent().filter(|d| !d.exists()) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    }
    let listener = UnixListener::bind(socket)?;
    {
        use std::os::unix::fs::PermissionsExt;
        // Every local user may connect; what they may do is decided by their peer credentials.
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666))?;
    }
    info!("API listening on {}", socket.display());
    let limits = engine.cfg.api;
    let app = router(engine, inboxes, notifier);
    let admission = Arc::new(Admission {
        limits,
        open: Mutex::default(),
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let stopping = CancellationToken::new();
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(err) => {
                        warn!("accepting an API connection failed: {err}");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                let peer = Peer::of(&stream);
                let slot = match admission.admit(peer.uid) {
                    Ok(slot) => slot,
                    Err(why) => {
                        refuse(&stream, &why);
                        continue;
                    }
                };
                let app = app.clone();
                let service = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(ConnectInfo(peer));
                    tower_service::Service::call(&mut app.clone(), req)
                });
                // Upgrades: `gantry attach`'s terminal (the connection then leaves HTTP, and its slot).
                let conn = http.serve_connection(TokioIo::new(stream), service).with_upgrades();
                let stopping = stopping.clone();
                conns.spawn(async move {
                    let _slot = slot;
                    tokio::pin!(conn);
                    let ended = tokio::select! {
                        r = conn.as_mut() => r,
                        _ = stopping.cancelled() => {
                            // Finish the request in flight, then close.
                            conn.as_mut().graceful_shutdown();
                            conn.await
                        }
                    };
                    if let Err(err) = ended {
                        debug!(uid = peer.uid, "API connection ended: {err}");
                    }
                });
            }
        }
    }
    drop(listener);
    stopping.cancel();
    if tokio::time::timeout(SHUTDOWN_GRACE, async { while conns.join_next().await.is_some() {} })
        .await
        .is_err()
    {
        info!("closing remaining API connections");
    }
    conns.shutdown().await;
    Ok(())
}

/// Counts open connections per uid and in total.
struct Admission {
    limits: Limits,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    total: usize,
    by_uid: HashMap<u32, usize>,
    /// Uids refused since their last connection closed: warn once per episode, not per connection.
    refusing: HashSet<u32>,
}

/// One admitted connection; frees its place when dropped.
struct Slot {
    admission: Arc<Admission>,
    uid: u32,
}

impl Admission {
    fn admit(self: &Arc<Self>, uid: u32) -> Result<Slot, String> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let mine = open.by_uid.get(&uid).copied().unwrap_or(0);
        let why = if mine >= self.limits.per_uid {
            format!(
                "too many connections from uid {uid}: at most {} per user; close some and try again",
                self.limits.per_uid
            )
        } else if open.total >= self.limits.total {
            format!(
                "the engine has {} connections open, its limit; try again shortly",
                self.limits.total
            )
        } else {
            open.total += 1;
            *open.by_uid.entry(uid).or_default() += 1;
            return Ok(Slot {
                admission: self.clone(),
                uid,
            });
        };
        if open.refusing.insert(uid) {
            warn!("refusing API connections: {why}");
        } else {
            debug!("refusing an API connection: {why}");
        }
        Err(why)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.admission.open.lock().unwrap_or_else(|p| p.into_inner());
        open.total -= 1;
        if let Some(n) = open.by_uid.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                open.by_uid.remove(&self.uid);
            }
        }
        open.refusing.remove(&self.uid);
    }
}

/// Answer 503 with the reason if the socket takes it at once (never wait on a refused client), then close.
fn refuse(stream: &UnixStream, why: &str) {
    let body = serde_json::to_string(&ApiError {
        error: why.into(),
        spec_error: None,
    })
    .unwrap_or_default();
    let reply = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(reply.as_bytes());
}
