//! Finding the engine on this machine (the system socket, the user's own, the app's), and
//! `gantry proxy`, the far end of a client over ssh.

use super::*;

/// `gantry proxy`: joins stdin/stdout to the engine's socket, for a client on another computer that
/// runs it through ssh. It connects as whoever runs it (the ssh user), so the engine sees that uid.
pub async fn proxy(socket: &Path) -> Result<(), ClientError> {
    let mut engine = match UnixStream::connect(socket).await {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Err(ClientError::NoEngine(socket.into()))
        }
        Err(error) => {
            return Err(ClientError::Connect {
                socket: socket.into(),
                error,
            })
        }
    };
    let mut stdio = tokio::io::join(tokio::io::stdin(), tokio::io::stdout());
    // Ends when both sides have closed: the client's EOF is passed on as a half-close.
    tokio::io::copy_bidirectional(&mut stdio, &mut engine)
        .await
        .map_err(|e| ClientError::Protocol(format!("proxy: {e}")))?;
    Ok(())
}

/// How a client found its engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FoundBy {
    /// `--state-dir` or `GANTRY_STATE_DIR`.
    StateDir,
    /// The machine's engine (`gantry daemon --system`).
    System,
    /// The user's own state dir.
    User,
}

/// The engine's socket: an explicit state dir wins, then the system engine if it answers, then the
/// user's own state dir (so a shared machine's users all reach the one engine without configuring).
/// The user's socket comes back whether or not it answers: the CLI then says no engine runs there, and
/// the app hosts one there.
pub fn discover(
    explicit: Option<PathBuf>,
    system_socket: &Path,
    system_answers: bool,
    user_dir: PathBuf,
) -> (PathBuf, FoundBy) {
    match explicit {
        Some(dir) => (Paths::in_dir(dir, PathBuf::new()).socket(), FoundBy::StateDir),
        None if system_answers => (system_socket.to_path_buf(), FoundBy::System),
        None => (Paths::in_dir(user_dir, PathBuf::new()).socket(), FoundBy::User),
    }
}

/// The system engine's socket. `GANTRY_SYSTEM_SOCKET` (hidden) moves it, for tests.
pub fn system_socket() -> PathBuf {
    std::env::var_os("GANTRY_SYSTEM_SOCKET")
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(crate::config::SYSTEM_SOCKET))
}

/// Whether an engine accepts connections on `socket` (a stale socket file of a stopped one refuses).
pub fn answers(socket: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(socket).is_ok()
}

/// [`discover`] on this machine; `explicit` is `--state-dir` / `GANTRY_STATE_DIR`.
pub fn locate(explicit: Option<PathBuf>) -> (PathBuf, FoundBy) {
    let system = system_socket();
    let live = explicit.is_none() && answers(&system);
    discover(explicit, &system, live, Paths::default_state_dir())
}

/// Which engine a client talks to (the app's header says it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineRef {
    /// Found by [`locate`], and answering.
    Found { by: FoundBy, socket: PathBuf },
    /// Hosted by this process (the app), on the GPUs of `gpus` (`sim:…`; `None`: the machine's).
    Embedded { socket: PathBuf, gpus: Option<String> },
    /// Another engine of this user, found through the machine lock it holds.
    Holder(Holder),
    /// Another user's engine holds the machine lock and cannot be used: there is no engine to talk to.
    Blocked(Holder),
    /// A workstation's engine, through `ssh HOST gantry proxy`.
    Remote { host: String },
}

impl EngineRef {
    /// The API socket to talk to (`None` when blocked).
    pub fn socket(&self) -> Option<&Path> {
        match self {
            EngineRef::Found { socket, .. } | EngineRef::Embedded { socket, .. } => Some(socket),
            EngineRef::Holder(h) => h.socket.as_deref(),
            EngineRef::Blocked(_) | EngineRef::Remote { .. } => None,
        }
    }

    /// The header line; `home` is shortened to `~`.
    pub fn label(&self, home: &Path) -> String {
        let dir = |socket: &Path| {
            let d = socket.parent().unwrap_or(socket);
            match d.strip_prefix(home) {
                Ok(rest) if !home.as_os_str().is_empty() && home != Path::new("/") => {
                    Path::new("~").join(rest).display().to_string()
                }
                _ => d.display().to_string(),
            }
        };
        match self {
            EngineRef::Found {
                by: FoundBy::System,
                socket,
            } => format!("System engine ({})", socket.display()),
            EngineRef::Found {
                by: FoundBy::User,
                socket,
            } => format!("Your engine ({})", dir(socket)),
            EngineRef::Found {
                by: FoundBy::StateDir,
                socket,
            } => format!("Engine in {}", dir(socket)),
            EngineRef::Embedded { gpus: Some(g), .. } => format!(
                "Engine in this app (simulated GPUs {})",
                g.strip_prefix("sim:").unwrap_or(g)
            ),
            EngineRef::Embedded { gpus: None, .. } => "Engine in this app (this machine's GPUs)".into(),
            EngineRef::Holder(h) => format!("Engine of {}", h.user),
            EngineRef::Blocked(h) => format!("Engine of {} (cannot connect)", h.user),
            EngineRef::Remote { host } => format!("{host} (through ssh)"),
        }
    }

    pub fn view(&self) -> EngineView {
        let kind = match self {
            EngineRef::Found {
                by: FoundBy::System, ..
            } => EngineKind::System,
            EngineRef::Found { by: FoundBy::User, .. } => EngineKind::User,
            EngineRef::Found {
                by: FoundBy::StateDir, ..
            } => EngineKind::StateDir,
            EngineRef::Embedded { .. } => EngineKind::Embedded,
            EngineRef::Holder(_) => EngineKind::Holder,
            EngineRef::Blocked(_) => EngineKind::Blocked,
            EngineRef::Remote { .. } => EngineKind::Remote,
        };
        let problem = match self {
            EngineRef::Blocked(h) => Some(LockError::Held(h.clone()).to_string()),
            _ => None,
        };
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
        EngineView {
            kind,
            label: self.label(&home),
            socket: self.socket().map(Path::to_path_buf),
            problem,
        }
    }
}
