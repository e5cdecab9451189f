//! Run a whole engine (store, sampler, scheduler, drop folder, API) until `shutdown` resolves.
//! Used by `gantry daemon` and by the desktop app's embedded engine.

use std::future::Future;
use std::sync::Arc;

use tracing::{info, warn};

use crate::engine::{Config, Engine, EngineError};

/// Open the engine, then serve. Returns when `shutdown` resolves (running containers keep running).
/// SIGHUP re-reads the lab config.
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), EngineError> {
    let engine = Engine::open(cfg)?;
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let reloader = {
        let e = engine.clone();
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                info!("SIGHUP: reloading the lab config");
                let _ = e.reload_policy(); // a failed reload is logged and keeps the policy in force
            }
        })
    };
    let r = run_engine(engine, shutdown).await;
    reloader.abort();
    r
}

pub async fn run_engine(engine: Arc<Engine>, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), EngineError> {
    raise_fd_limit();
    // Every drop folder's watcher; they stop with the engine. The API reads the same registry.
    let inboxes = Arc::new(crate::inbox::users::Registry::default());
    let inbox = tokio::spawn(crate::inbox::users::run(engine.clone(), inboxes.clone()));
    let looped = {
        let e = engine.clone();
        tokio::spawn(async move {
            let r = e.clone().run().await;
            e.shutdown(); // a fatal error stops the whole daemon, loudly
            r
        })
    };
    let stop = engine.clone();
    let socket = engine.cfg.paths.socket();
    let served = crate::api::serve(engine.clone(), inboxes, &socket, async move {
        tokio::select! {
            _ = shutdown => {}
            _ = stop.stopped() => {}
        }
        stop.shutdown();
    })
    .await;
    engine.shutdown();
    inbox.abort();
    let result = match looped.await {
        Ok(r) => r,
        Err(e) => {
            warn!("engine loop ended abnormally: {e}");
            Ok(())
        }
    };
    if !matches!(served, Err(EngineError::AlreadyRunning(_))) {
        let _ = std::fs::remove_file(&socket);
    }
    served.and(result)
}

/// Every API connection, log file and Docker call is a descriptor; the usual soft limit (1024) is far
/// below the hard one, and running out makes the engine fail at everything at once.
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => info!("open file limit raised from {soft} to {hard}"),
            Err(e) => warn!("could not raise the open file limit from {soft} to {hard}: {e}"),
        },
        Ok(_) => {}
        Err(e) => warn!("could not read the open file limit: {e}"),
    }
}
