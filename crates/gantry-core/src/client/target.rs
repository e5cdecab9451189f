//! Where the engine is (a local socket or a workstation over ssh) and the one connection to it.

use super::*;

/// Where the engine is: a Unix socket on this machine, or a workstation reached with the system `ssh`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Socket(PathBuf),
    /// `ssh HOST gantry proxy`: HOST is anything ssh accepts (`user@host`, a `~/.ssh/config` alias).
    /// The proxy runs as the ssh user on the workstation and connects to the engine there, so the
    /// engine sees that user's uid.
    Ssh {
        host: String,
        ssh: Vec<String>,
    },
}

impl Target {
    /// A remote workstation. `GANTRY_SSH` replaces the `ssh` program (with its own options, split on
    /// spaces: `ssh -F /path/config`).
    pub fn ssh(host: &str) -> Result<Target, ClientError> {
        let host = host.trim();
        // A leading `-` would be read by ssh as an option.
        if host.is_empty() || host.starts_with('-') || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ClientError::File(format!(
                "{host:?} is not a host name: write `user@host` or a Host from ~/.ssh/config"
            )));
        }
        let ssh = std::env::var("GANTRY_SSH")
            .ok()
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| "ssh".into());
        Ok(Target::Ssh {
            host: host.into(),
            ssh: ssh.split_whitespace().map(String::from).collect(),
        })
    }

    /// For messages: the socket, or `HOST`.
    pub fn describe(&self) -> String {
        match self {
            Target::Socket(s) => s.display().to_string(),
            Target::Ssh { host, .. } => host.clone(),
        }
    }

    /// The `ssh` command line for one connection. Every request opens its own `gantry proxy`, so each
    /// is its own connection to the engine (a `logs -f` stream never blocks other requests, and the
    /// engine checks each one's peer credentials), but ssh multiplexes them over one authenticated
    /// connection (ControlMaster, kept 60 s after the last request), so a request costs a channel,
    /// not a handshake.
    pub(super) fn command(&self) -> Option<tokio::process::Command> {
        let (mut c, host) = self.ssh_base()?;
        c.args(["--", &host, "gantry", "proxy"]);
        Some(c)
    }

    /// ssh with the options every connection uses (the shared ControlMaster), and the host.
    fn ssh_base(&self) -> Option<(tokio::process::Command, String)> {
        let Target::Ssh { host, ssh } = self else { return None };
        let mut c = tokio::process::Command::new(&ssh[0]);
        c.args(&ssh[1..]).args([
            "-T",
            "-o",
            "BatchMode=yes",
            "-o",
            "ServerAliveInterval=15",
            "-o",
            "ServerAliveCountMax=2",
        ]);
        if let Some(dir) = control_dir() {
            c.arg("-o")
                .arg("ControlMaster=auto")
                .arg("-o")
                .arg(format!("ControlPath={}/%C", dir.display()))
                .args(["-o", "ControlPersist=60"]);
        }
        Some((c, host.clone()))
    }

    /// `ssh -O forward -L 127.0.0.1:LOCAL:REMOTE HOST`: the shared connection (ControlMaster, which
    /// every request of this client opens) forwards this computer's loopback port `local` to
    /// `remote` (an address on the workstation, reached as the ssh user) until
    /// [`Target::cancel_forward_command`], or until it closes (60 s after its last session).
    pub fn forward_command(&self, local: u16, remote: &str) -> Option<tokio::process::Command> {
        let (mut c, host) = self.ssh_base()?;
        c.args(["-O", "forward", "-L"])
            .arg(format!("127.0.0.1:{local}:{remote}"))
            .args(["--", &host]);
        Some(c)
    }

    /// `ssh -O cancel -L …`: the shared connection stops the forward of [`Target::forward_command`].
    pub fn cancel_forward_command(&self, local: u16, remote: &str) -> Option<tokio::process::Command> {
        let (mut c, host) = self.ssh_base()?;
        c.args(["-O", "cancel", "-L"])
            .arg(format!("127.0.0.1:{local}:{remote}"))
            .args(["--", &host]);
        Some(c)
    }
}

/// Where ssh keeps its shared connections: the user's runtime dir or state dir (private, unlike
/// /tmp). `None` (no sharing) if neither can be made or is short enough: a socket path has at most
/// 107 bytes, and ssh adds 58 (`/` + 40 hex digits of `%C` + a 17-byte temporary suffix).
pub(super) fn control_dir() -> Option<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let runtime = std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d).join("gantry"));
    runtime.into_iter().chain([Paths::default_state_dir()]).find(|dir| {
        dir.as_os_str().len() <= 107 - 58
            && std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .is_ok()
    })
}

/// One connection to the engine: a Unix socket, or a `gantry proxy` behind ssh (its stdout and stdin).
pub(super) trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// The ssh child lives as long as the connection (a streamed answer keeps it); dropping it ends ssh.
pub(super) struct SshIo {
    pub(super) io: tokio::io::Join<tokio::process::ChildStdout, tokio::process::ChildStdin>,
    pub(super) _child: tokio::process::Child,
}

impl AsyncRead for SshIo {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for SshIo {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
