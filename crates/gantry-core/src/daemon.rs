//! Assemble a whole engine (store, sampler, scheduler, drop folder, API) and run it until `shutdown`
//! resolves. [`EngineSetup`] is the one way an engine is put together: `gantry daemon` fills it from
//! its flags, the desktop app's embedded engine from its environment ([`EngineSetup::from_env`]).

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::config::{under, Overrides};
use crate::engine::{Config, Engine, EngineError, Paths};
use crate::machine_lock::{self, LockError, MachineLock};
use crate::policy::{PolicyError, SYSTEM_CONFIG};

/// Everything that decides how an engine is assembled. `Default` is a user's engine in their own
/// state dir, with the built-in policy.
#[derive(Debug, Clone, Default)]
pub struct EngineSetup {
    /// The machine's engine (`gantry daemon --system`), with `/var/lib/gantry`, `/run/gantry` and
    /// `/etc/gantry` under this root (`/` except in tests). `None`: one user's engine.
    pub system_root: Option<PathBuf>,
    /// A user's engine: where its database, logs and socket live (default: `$XDG_STATE_HOME/gantry`).
    pub state_dir: Option<PathBuf>,
    /// The drop folder. Default: `~/Gantry/inbox`, or `STATE_DIR/inbox` when `state_dir` is given;
    /// the system engine's own is its state dir's `inbox`.
    pub inbox: Option<PathBuf>,
    /// Simulated GPUs (`sim:2x24GiB`); default: the lab config's `simulate`, else NVML.
    pub gpus: Option<String>,
    /// The lab config. `None`: the system engine reads `/etc/gantry/config.toml` if it exists; a
    /// user's engine keeps the built-in defaults.
    pub config: Option<PathBuf>,
    /// Settings that win over the lab config, also after a reload.
    pub overrides: Overrides,
    /// API: close a connection whose request head has not arrived after this long.
    pub header_timeout: Option<Duration>,
    /// System engine: members of this group get their drop folder made and watched (wins over the
    /// lab config's `[inbox] group`).
    pub inbox_group: Option<String>,
    /// System engine: each user's drop folder, relative to their home (wins over `[inbox] path`).
    pub inbox_path: Option<PathBuf>,
    /// How often GPUs are sampled (benchmarks shorten it).
    pub sample_every: Option<Duration>,
}

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Config(#[from] PolicyError),
    #[error("{0}")]
    InboxPath(String),
    #[error(transparent)]
    Lock(#[from] LockError),
}

impl EngineSetup {
    /// The desktop app's embedded engine, from its environment: `GANTRY_STATE_DIR` and
    /// `GANTRY_CONFIG` (which `gantry daemon` reads too), `GANTRY_GPUS`, `GANTRY_INBOX` and
    /// `GANTRY_SAMPLE_MS` (benchmarks fill an hour of samples quickly with e.g. 10).
    pub fn from_env() -> EngineSetup {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`EngineSetup::from_env`] over any variables; empty ones count as unset.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> EngineSetup {
        let var = |k: &str| var(k).filter(|v| !v.is_empty());
        EngineSetup {
            state_dir: var("GANTRY_STATE_DIR").map(PathBuf::from),
            inbox: var("GANTRY_INBOX").map(PathBuf::from),
            gpus: var("GANTRY_GPUS"),
            config: var("GANTRY_CONFIG").map(PathBuf::from),
            sample_every: var("GANTRY_SAMPLE_MS")
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis),
            ..EngineSetup::default()
        }
    }

    /// Where the engine keeps its state, socket and drop folder.
    pub fn paths(&self) -> Paths {
        match &self.system_root {
            Some(root) => {
                let mut p = Paths::system(root);
                p.inbox = self.inbox.clone().unwrap_or(p.inbox);
                p
            }
            None => {
                let state_dir = self.state_dir.clone().unwrap_or_else(Paths::default_state_dir);
                let inbox = self.inbox.clone().unwrap_or_else(|| {
                    if self.state_dir.is_some() {
                        state_dir.join("inbox")
                    } else {
                        Paths::default_inbox()
                    }
                });
                Paths::in_dir(state_dir, inbox)
            }
        }
    }

    /// The engine's configuration: paths, the lab config read, then the settings given here on top.
    pub fn config(&self) -> Result<Config, SetupError> {
        let mut cfg = Config::new(self.paths());
        cfg.gpus = self.gpus.clone();
        cfg.overrides = self.overrides.clone();
        match (&self.config, &self.system_root) {
            (Some(f), _) => cfg.load_lab(f.clone(), false)?,
            // The system engine's file is optional: without it, the defaults.
            (None, Some(root)) => cfg.load_lab(under(root, SYSTEM_CONFIG), true)?,
            (None, None) => {}
        }
        if let Some(t) = self.header_timeout {
            cfg.api.header_read_timeout = t;
        }
        if let Some(p) = &self.inbox_path {
            crate::inbox::users::check_inbox_path(p).map_err(SetupError::InboxPath)?;
            cfg.inbox_path = p.clone();
        }
        cfg.inbox_group = self.inbox_group.clone().or(cfg.inbox_group);
        if let Some(every) = self.sample_every {
            cfg.sample_every = every;
        }
        Ok(cfg)
    }

    /// One non-system engine per machine's GPUs (every client finds the system engine first): the
    /// lock for `cfg`'s GPUs, held until dropped. `None` for the system engine, which takes none.
    pub async fn lock(cfg: &Config) -> Result<Option<MachineLock>, LockError> {
        if cfg.paths.system_root.is_some() {
            return Ok(None);
        }
        Ok(Some(
            machine_lock::take(&machine_lock::lock_name(cfg.gpus.as_deref()), &cfg.paths.socket()).await?,
        ))
    }
}

/// `gantry daemon`: open the engine, then serve. Returns when `shutdown` resolves (running
/// containers keep running). SIGHUP re-reads the lab config.
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

/// Serve an open engine (the app's embedded one; [`run`] for the daemon) until `shutdown` resolves.
pub async fn run_engine(
    engine: Arc<Engine>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), EngineError> {
    raise_fd_limit();
    // Notifications: the API adds targets, one owned task delivers (stops with the engine).
    let notifier = Arc::new(crate::notify::Notifier::open(&engine)?);
    // Every drop folder's watcher; they stop with the engine. The API reads the same registry.
    let inboxes = Arc::new(crate::inbox::users::Registry::default());
    let inbox = tokio::spawn(crate::inbox::users::run(engine.clone(), inboxes.clone()));
    let delivery = tokio::spawn(notifier.clone().run(engine.clone()));
    // `/metrics`, when the lab config asks for it.
    let metrics = engine
        .cfg
        .lab
        .metrics
        .listen
        .map(|addr| tokio::spawn(crate::metrics::serve(engine.clone(), addr)));
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
    let served = crate::api::serve(engine.clone(), inboxes, notifier, &socket, async move {
        tokio::select! {
            _ = shutdown => {}
            _ = stop.stopped() => {}
        }
        stop.shutdown();
    })
    .await;
    engine.shutdown();
    inbox.abort();
    delivery.abort();
    if let Some(m) = metrics {
        m.abort();
    }
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
