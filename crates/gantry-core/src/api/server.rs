//! Serving the router on the Unix socket: binding it, admitting connections (per-uid and total
//! caps), refusing the rest, and the graceful shutdown.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::engine::{Engine, EngineError};
use crate::inbox::users::Registry;
use crate::notify::Notifier;
use crate::protocol::ApiError;

use super::{router, Limits, Peer, SHUTDOWN_GRACE};

/// After a failed accept (e.g. EMFILE), wait this long instead of spinning on the error.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

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
