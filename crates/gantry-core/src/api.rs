//! The engine's local API: HTTP+JSON on a Unix socket. The caller's identity is the socket's peer
//! credentials (uid/gid), never something the client claims.
//!
//! This module owns who is calling ([`Peer`], [`Viewer`]), how errors answer, and the router; the
//! routes are in `jobs`, `stats`, `caller` (notifications, bookings, drop folder) and `streams`
//! (logs, terminals, ports, events); `server` serves the router on the socket.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use tokio::net::UnixStream;

use crate::engine::{Engine, EngineError};
use crate::inbox::users::Registry;
use crate::notify::Notifier;
use crate::protocol::routes::{
    ATTACH, BOOKINGS, BOOKING_CANCEL, CANCEL, COMPARE, EVENTS, GPUS, GPUS_RECENT, GPU_MINUTES, HISTORY, HISTORY_COUNT,
    HOLD, INBOX, JOB, JOBS, LOGS, NOTIFY, NOTIFY_LOG, NOTIFY_REMOVE, NOTIFY_TEST, OPEN, PREVIEW, PRIORITY, QUEUE_PAGE,
    RELEASE, RERUN, RESULTS, STATUS, TIMELINE, USAGE, USAGE_CHARTS, USAGE_EFFICIENCY, VALIDATE, WHOAMI,
};
use crate::protocol::{ApiError, Attempt, Event, JobDetailView, JobView};
use crate::store::Job;

mod caller;
mod jobs;
mod server;
mod stats;
mod streams;

use caller::{
    book, booking_cancel, bookings_list, inbox, inbox_init, notify_add, notify_list, notify_log, notify_remove,
    notify_test, whoami,
};
use jobs::{cancel, hold, job, preview, priority, queue, queue_page, release, rerun, status, submit, validate};
pub use server::serve;
use stats::{
    compare, gpu_minutes, gpus, gpus_recent, history, history_count, results, timeline, usage, usage_charts,
    usage_efficiency,
};
pub use streams::LogStreams;
use streams::{attach, events, logs, open_port};

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
            // Owner and admins only, like its log.
            efficiency: d.efficiency.filter(|_| shown),
        }
    }
}

pub use crate::config::ApiLimits as Limits;

/// On shutdown, requests in flight get this long; streams (`logs -f`, the app's events) never end
/// on their own, so they are cut after it.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

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
        .route(USAGE_EFFICIENCY, get(usage_efficiency))
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
