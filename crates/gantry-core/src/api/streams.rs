//! The routes that stream: a job's log (with the per-uid cap on open streams), a session's
//! terminal, a job's forwarded port, and the event feed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use hyper_util::rt::TokioIo;
use tracing::debug;

use crate::inbox::user_name;
use crate::protocol::{ApiError, LogQuery};

use super::{Failure, Peer, Res, E};

/// The job's log file, streamed: read a chunk at a time as the socket drains (never the whole
/// file per reader); with `follow`, until the job has ended. Each uid has at most the lab's
/// `[logs] streams_per_user` streams open; one more is refused, saying so.
pub(super) async fn logs(
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
pub(super) async fn attach(
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
pub(super) async fn open_port(
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
pub(super) async fn events(State(e): E) -> Response {
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
