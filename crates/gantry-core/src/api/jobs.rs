//! The job routes: the engine's status, submitting (and its dry runs), the queue, one job, and
//! the owner's cancel, priority, hold, release and rerun.

use std::path::Path;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path as UrlPath, Query, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use crate::engine::submit::{Spec, Submission};
use crate::engine::EngineError;
use crate::inbox::user_name;
use crate::inbox::users::Registry;
use crate::protocol::{JobDetailView, JobState, PriorityRequest, QueuePageQuery, StatusInfo, SubmitRequest, Submitted};
use crate::spec::ValidJob;
use crate::store::Owner;

use super::{Failure, Peer, Res, Viewer, E};

pub(super) async fn status(
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

pub(super) async fn submit(
    State(e): E,
    ConnectInfo(p): ConnectInfo<Peer>,
    Json(r): Json<SubmitRequest>,
) -> Res<Submitted> {
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
pub(super) async fn queue(State(e): E) -> Result<Response, Failure> {
    let body = tokio::task::spawn_blocking(move || e.queue_json())
        .await
        .map_err(|err| EngineError::Fatal(format!("listing the queue crashed: {err}")))??;
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// `gantry ls`'s page of the queue: public rows only, as [`queue`]; the caller's own jobs among them.
pub(super) async fn queue_page(
    State(e): E,
    ConnectInfo(p): ConnectInfo<Peer>,
    Query(q): Query<QueuePageQuery>,
) -> Result<Response, Failure> {
    let body = tokio::task::spawn_blocking(move || e.queue_page_json(q.limit, p.uid))
        .await
        .map_err(|err| EngineError::Fatal(format!("listing the queue crashed: {err}")))??;
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response())
}

pub(super) async fn job(
    State(e): E,
    ConnectInfo(p): ConnectInfo<Peer>,
    UrlPath(id): UrlPath<i64>,
) -> Res<JobDetailView> {
    Ok(Json(JobDetailView::new(
        e.job_detail(id)?,
        Viewer::of(&e.policy(), p.uid),
    )))
}

pub(super) async fn cancel(State(e): E, ConnectInfo(p): ConnectInfo<Peer>, UrlPath(id): UrlPath<i64>) -> Res<JobState> {
    Ok(Json(e.cancel(id, p.uid)?))
}

pub(super) async fn priority(
    State(e): E,
    ConnectInfo(p): ConnectInfo<Peer>,
    UrlPath(id): UrlPath<i64>,
    Json(r): Json<PriorityRequest>,
) -> Res<bool> {
    Ok(Json(e.set_priority(id, r.priority, p.uid)?))
}

/// `true` when the job was queued and not held yet; `false` when it is not queued or already held.
pub(super) async fn hold(State(e): E, ConnectInfo(p): ConnectInfo<Peer>, UrlPath(id): UrlPath<i64>) -> Res<bool> {
    Ok(Json(e.hold(id, true, p.uid)?))
}

pub(super) async fn release(State(e): E, ConnectInfo(p): ConnectInfo<Peer>, UrlPath(id): UrlPath<i64>) -> Res<bool> {
    Ok(Json(e.hold(id, false, p.uid)?))
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
pub(super) async fn validate(State(e): E, Json(r): Json<SubmitRequest>) -> Res<ValidJob> {
    Ok(Json(e.validate_file(&r.text, &r.file_name, r.base_dir)?))
}

/// A dry run of `submit`, as the caller (mounts checked as them, their limits): nothing queued.
pub(super) async fn preview(
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
pub(super) async fn rerun(State(e): E, ConnectInfo(p): ConnectInfo<Peer>, UrlPath(id): UrlPath<i64>) -> Res<Submitted> {
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
