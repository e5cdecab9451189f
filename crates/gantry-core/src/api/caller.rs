//! The caller's own settings: notification targets (and the error mapping of notify), GPU
//! bookings, their drop folder, and who they are.

use std::sync::Arc;

use axum::extract::{ConnectInfo, Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};

use crate::engine::EngineError;
use crate::inbox::user_name;
use crate::inbox::users::Registry;
use crate::notify::{Notifier, NotifyError};
use crate::protocol::{ApiError, InboxInfo, WhoAmI};
use crate::protocol::{NotifyAdd, NotifyDelivery, NotifyLogQuery, Subscription};

use super::{Failure, Peer, Res, E};

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
pub(super) async fn notify_list(Extension(n): N, ConnectInfo(p): ConnectInfo<Peer>) -> Res<Vec<Subscription>> {
    Ok(Json(
        tokio::task::spawn_blocking(move || n.list(p.uid))
            .await
            .map_err(|err| EngineError::Fatal(format!("notify ls crashed: {err}")))??,
    ))
}

/// Subscribe the caller (never anyone else: the target is theirs, and only their jobs reach it).
pub(super) async fn bookings_list(
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

pub(super) async fn book(
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

pub(super) async fn booking_cancel(
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

pub(super) async fn notify_add(
    State(e): E,
    Extension(n): N,
    ConnectInfo(p): ConnectInfo<Peer>,
    Json(r): Json<NotifyAdd>,
) -> Res<Subscription> {
    Ok(Json(n.add(&e, p.uid, &user_name(p.uid), r).await?))
}

pub(super) async fn notify_remove(
    Extension(n): N,
    ConnectInfo(p): ConnectInfo<Peer>,
    UrlPath(id): UrlPath<i64>,
) -> Res<bool> {
    Ok(Json(
        tokio::task::spawn_blocking(move || n.remove(p.uid, id))
            .await
            .map_err(|err| EngineError::Fatal(format!("notify rm crashed: {err}")))??,
    ))
}

pub(super) async fn notify_test(Extension(n): N, ConnectInfo(p): ConnectInfo<Peer>) -> Res<Vec<NotifyDelivery>> {
    Ok(Json(
        tokio::task::spawn_blocking(move || n.test(p.uid, &user_name(p.uid)))
            .await
            .map_err(|err| EngineError::Fatal(format!("notify test crashed: {err}")))??,
    ))
}

pub(super) async fn notify_log(
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

/// The caller's drop folder and whether the engine watches it.
pub(super) async fn inbox(
    State(e): E,
    Extension(inboxes): Extension<Arc<Registry>>,
    ConnectInfo(p): ConnectInfo<Peer>,
) -> Json<InboxInfo> {
    Json(inboxes.info(&e, p.uid))
}

/// `gantry inbox init`: the caller made their drop folder (as themselves); watch it from now on.
pub(super) async fn inbox_init(
    State(e): E,
    Extension(inboxes): Extension<Arc<Registry>>,
    ConnectInfo(p): ConnectInfo<Peer>,
) -> Res<InboxInfo> {
    let info = tokio::task::spawn_blocking(move || inboxes.register(&e, p.uid))
        .await
        .map_err(|err| EngineError::Fatal(format!("inbox init crashed: {err}")))??;
    Ok(Json(info))
}

pub(super) async fn whoami(ConnectInfo(p): ConnectInfo<Peer>) -> Json<WhoAmI> {
    Json(WhoAmI {
        uid: p.uid,
        name: user_name(p.uid),
    })
}
