//! Engine configuration: where state lives and every tunable, with its default and the reason for it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::policy::{LabConfig, Policy, PolicyError};

pub use crate::defaults::*;

/// Where an engine keeps its state, and where it listens.
#[derive(Debug, Clone)]
pub struct Paths {
    pub state_dir: PathBuf,
    pub inbox: PathBuf,
    socket: PathBuf,
    /// `Some(root)` for the system engine (`/` except in tests): it serves every user's drop folder.
    pub system_root: Option<PathBuf>,
}

impl Paths {
    /// A per-user (or `--state-dir`) engine: the socket lives in the state dir.
    pub fn in_dir(state_dir: PathBuf, inbox: PathBuf) -> Paths {
        Paths {
            socket: state_dir.join("gantry.sock"),
            state_dir,
            inbox,
            system_root: None,
        }
    }
    /// The machine's engine (`gantry daemon --system`): state in `/var/lib/gantry`, socket in
    /// `/run/gantry`, both under `root` (`/` except in tests). `inbox` is root's own drop folder (the
    /// state dir's `inbox`); users drop into `~/<Config::inbox_path>`.
    pub fn system(root: &Path) -> Paths {
        let state_dir = under(root, SYSTEM_STATE_DIR);
        Paths {
            inbox: state_dir.join("inbox"),
            socket: under(root, SYSTEM_SOCKET),
            state_dir,
            system_root: Some(root.to_path_buf()),
        }
    }
    pub fn db(&self) -> PathBuf {
        self.state_dir.join("gantry.db")
    }
    pub fn socket(&self) -> PathBuf {
        self.socket.clone()
    }
    pub fn logs(&self) -> PathBuf {
        self.state_dir.join("logs")
    }
    /// XDG default: `$XDG_STATE_HOME/gantry` (or `~/.local/state/gantry`), inbox `~/Gantry/inbox`.
    pub fn default_state_dir() -> PathBuf {
        if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|x| !x.is_empty()) {
            return PathBuf::from(x).join("gantry");
        }
        home().join(".local/state/gantry")
    }
    pub fn default_inbox() -> PathBuf {
        home().join("Gantry/inbox")
    }
}

/// `abs` (an absolute path) re-rooted at `root`.
pub fn under(root: &Path, abs: &str) -> PathBuf {
    root.join(abs.trim_start_matches('/'))
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"))
}

#[derive(Debug, Clone)]
pub struct Config {
    pub paths: Paths,
    /// `sim:NxMEM` forces simulated GPUs.
    pub gpus: Option<String>,
    pub scheduler: crate::scheduler::Config,
    /// The lab config as read at start (built-in defaults without a file). The engine's live policy
    /// starts as `lab.policy` with `overrides` applied, and changes on reload.
    pub lab: LabConfig,
    /// The file re-read on reload (SIGHUP); `None`: a per-user engine without `--config`.
    pub lab_file: Option<PathBuf>,
    /// Whether a missing `lab_file` means the defaults (the system engine's) or an error.
    pub lab_file_optional: bool,
    /// Daemon flags: they win over the file, also after a reload.
    pub overrides: Overrides,
    pub sample_every: Duration,
    /// API connection limits and header-read timeout.
    pub api: ApiLimits,
    /// System engine: members of this group (primary or supplementary) get `~/<inbox_path>` made
    /// (as themselves) and watched; others run `gantry inbox init`.
    pub inbox_group: Option<String>,
    /// System engine: each user's drop folder, relative to their home.
    pub inbox_path: PathBuf,
    /// Lab-wide template folders (`<dir>/<name>/gantry.toml`, owned by root), used by dropping into
    /// `<inbox>/<name>/`. The system engine's default is `/etc/gantry/templates`; `None` for others.
    pub templates_dir: Option<PathBuf>,
}

/// Settings given as daemon flags (`--stop-grace`, ...), which win over the lab config.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub stop_grace: Option<Duration>,
    pub retry_backoff: Option<Duration>,
    pub reserve_after: Option<Duration>,
}

impl Overrides {
    pub fn apply(&self, mut p: Policy) -> Policy {
        p.stop_grace = self.stop_grace.unwrap_or(p.stop_grace);
        p.retry_backoff = self.retry_backoff.unwrap_or(p.retry_backoff);
        p.reserve_after = self.reserve_after.unwrap_or(p.reserve_after);
        p
    }
}

impl Config {
    pub fn new(paths: Paths) -> Self {
        Config {
            gpus: None,
            scheduler: crate::scheduler::Config::default(),
            lab: LabConfig::default(),
            lab_file: None,
            lab_file_optional: false,
            overrides: Overrides::default(),
            sample_every: SAMPLE_EVERY,
            api: ApiLimits::default(),
            inbox_group: None,
            inbox_path: PathBuf::from(INBOX_PATH),
            templates_dir: paths.system_root.as_deref().map(|r| under(r, SYSTEM_TEMPLATES_DIR)),
            paths,
        }
    }

    /// Read the lab config `file` (see [`LabConfig::load`]); its settings apply where no daemon flag
    /// (`--gpus`, `--stop-grace`, ...) was given.
    pub fn load_lab(&mut self, file: PathBuf, missing_ok: bool) -> Result<(), PolicyError> {
        let lab = LabConfig::load(&file, missing_ok)?;
        if self.gpus.is_none() {
            self.gpus = lab.simulate.clone();
        }
        if let Some(g) = &lab.inbox_group {
            self.inbox_group = Some(g.clone());
        }
        if let Some(p) = &lab.inbox_path {
            self.inbox_path = p.clone();
        }
        if let Some(t) = &lab.templates_dir {
            self.templates_dir = Some(t.clone());
        }
        self.lab = lab;
        self.lab_file = Some(file);
        self.lab_file_optional = missing_ok;
        Ok(())
    }

    /// The policy the engine starts with.
    pub fn policy(&self) -> Policy {
        self.overrides.apply(self.lab.policy.clone())
    }
}

/// Connection limits of the API. A connection is one file descriptor and one task in the engine.
#[derive(Debug, Clone, Copy)]
pub struct ApiLimits {
    /// A request's head must arrive within this long after the connection opens (or goes idle);
    /// otherwise the connection is closed, so half-sent requests cannot pin descriptors.
    pub header_read_timeout: Duration,
    /// Open connections per uid; more are closed at once with a 503.
    pub per_uid: usize,
    /// Open connections in all; more are closed at once with a 503.
    pub total: usize,
}

impl Default for ApiLimits {
    fn default() -> Self {
        ApiLimits {
            header_read_timeout: HEADER_READ_TIMEOUT,
            per_uid: MAX_CONNECTIONS_PER_UID,
            total: MAX_CONNECTIONS,
        }
    }
}
