//! One non-system engine per set of GPUs: an abstract Unix socket (`@gantry-engine`) held for the
//! engine's lifetime. The kernel frees it when the process dies, so there is never a stale lock to clean
//! up, and a second engine (another user's app, a per-user `gantry daemon`) learns who holds it by
//! connecting: the holder answers one JSON line (uid, pid, API socket), and the kernel's peer
//! credentials confirm uid and pid, so a squatter cannot pose as someone else.
//!
//! `gantry daemon --system` takes no lock: clients find it first, and when an embedded engine is forced
//! up beside it, each counts the other's GPU containers as busy (GPU UUID labels).

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener as StdListener, UnixStream as StdStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};

/// Abstract socket names are at most 107 bytes.
const MAX_NAME: usize = 107;
/// A live holder answers at once; one that does not within this long is stuck, and still holds the lock.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// Who holds a machine lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub uid: u32,
    pub pid: u32,
    /// The holder's API socket (`None`: it did not say).
    pub socket: Option<PathBuf>,
    /// The user name of `uid` (filled in by the reader, never sent).
    #[serde(default, skip_deserializing)]
    pub user: String,
}

impl Holder {
    /// Whether the holder runs as the calling user (then its engine is the caller's to use).
    pub fn is_mine(&self) -> bool {
        self.uid == nix::unistd::getuid().as_raw()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "the Gantry engine of {} (pid {}, socket {}) already manages this machine's GPUs: use it, or ask an admin to install the Gantry service",
        .0.user, .0.pid, .0.socket.as_deref().map(|s| s.display().to_string()).unwrap_or_else(|| "unknown".into())
    )]
    Held(Holder),
    #[error("cannot take the machine lock @{name}: {error}")]
    Io { name: String, error: std::io::Error },
}

/// The lock's name for a GPU set (`Config::gpus`):
/// - real GPUs (no `sim:` spec, also when NVML then fails and the engine falls back to simulated ones:
///   it still runs on this machine): `gantry-engine`;
/// - a named simulated machine `sim:…@NAME`: `gantry-engine/sim/NAME` (engines given the same NAME see
///   the same GPU UUIDs, so they are one machine);
/// - an unnamed simulation (`sim:4x24GiB`: a demo, a benchmark, a test): a name of its own
///   (`gantry-engine/sim/pid-PID`), so it never blocks, nor is blocked by, anything. Such engines stand
///   for no machine; the test suite and e2e runs start many side by side.
pub fn lock_name(gpus: Option<&str>) -> String {
    match gpus.map(|g| g.trim()).filter(|g| !g.is_empty()) {
        None => "gantry-engine".into(),
        Some(spec) => match spec.split_once('@') {
            Some((_, machine)) => format!("gantry-engine/sim/{machine}"),
            None => format!("gantry-engine/sim/pid-{}", std::process::id()),
        },
    }
}

/// Held while the engine runs; dropping it frees the name.
#[derive(Debug)]
pub struct MachineLock {
    name: String,
    answering: tokio::task::JoinHandle<()>,
}

impl MachineLock {
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for MachineLock {
    fn drop(&mut self) {
        self.answering.abort(); // drops the listener: the name is free again
    }
}

fn addr(name: &str) -> Result<SocketAddr, LockError> {
    if name.len() > MAX_NAME {
        let error = std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("the name is longer than {MAX_NAME} bytes: use a shorter simulated machine name"),
        );
        return Err(LockError::Io {
            name: name.into(),
            error,
        });
    }
    SocketAddr::from_abstract_name(name.as_bytes()).map_err(|error| LockError::Io {
        name: name.into(),
        error,
    })
}

/// Take the lock `name` for an engine serving `socket`, or say who holds it. Needs a tokio runtime.
pub async fn take(name: &str, socket: &Path) -> Result<MachineLock, LockError> {
    let a = addr(name)?;
    let io = |error| LockError::Io {
        name: name.into(),
        error,
    };
    // A holder that exits between our failed bind and our connect freed the name: bind again.
    for _ in 0..3 {
        match StdListener::bind_addr(&a) {
            Ok(l) => {
                l.set_nonblocking(true).map_err(io)?;
                let listener = UnixListener::from_std(l).map_err(io)?;
                let line = serde_json::json!({ "uid": nix::unistd::getuid().as_raw(), "pid": std::process::id(), "socket": socket }).to_string() + "\n";
                tracing::info!("holding the machine lock @{name}");
                return Ok(MachineLock {
                    name: name.into(),
                    answering: tokio::spawn(answer(listener, line)),
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => match holder(name).await {
                Ok(Some(h)) => return Err(LockError::Held(h)),
                Ok(None) => continue,
                Err(e) => return Err(e),
            },
            Err(e) => return Err(io(e)),
        }
    }
    Err(io(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        "held by engines that keep exiting; try again",
    )))
}

/// Who holds `name`, or `None` when nobody does.
pub async fn holder(name: &str) -> Result<Option<Holder>, LockError> {
    let io = |error| LockError::Io {
        name: name.into(),
        error,
    };
    let s = match StdStream::connect_addr(&addr(name)?) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    s.set_nonblocking(true).map_err(io)?;
    let mut s = UnixStream::from_std(s).map_err(io)?;
    let cred = s.peer_cred().map_err(io)?;
    let mut buf = Vec::new();
    // Only the socket path comes from the answer: uid and pid are the kernel's.
    let said = match tokio::time::timeout(ANSWER_TIMEOUT, (&mut s).take(4096).read_to_end(&mut buf)).await {
        Ok(Ok(_)) => serde_json::from_slice::<Holder>(buf.trim_ascii_end()).ok(),
        _ => None,
    };
    let uid = cred.uid();
    Ok(Some(Holder {
        uid,
        pid: cred.pid().map(|p| p as u32).unwrap_or(0),
        socket: said.and_then(|h| h.socket),
        user: crate::access::user_name(uid),
    }))
}

/// Answer every connection with `line`. A fresh socket's send buffer takes a short line at once, so
/// one try needs neither a task per connection nor a timeout.
async fn answer(listener: UnixListener, line: String) {
    loop {
        match listener.accept().await {
            Ok((s, _)) => {
                let _ = s.try_write(line.as_bytes());
            }
            // Out of descriptors: keep the lock, and let the engine close some.
            Err(e) => {
                tracing::warn!("machine lock: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn unique(tag: &str) -> String {
        format!("gantry-engine/sim/unit-{tag}-{}", std::process::id())
    }

    #[test]
    fn lock_names_follow_the_gpu_set() {
        assert_eq!(lock_name(None), "gantry-engine");
        assert_eq!(lock_name(Some("sim:2x24GiB@lab-1")), "gantry-engine/sim/lab-1");
        assert_eq!(
            lock_name(Some("sim:2x24GiB")),
            format!("gantry-engine/sim/pid-{}", std::process::id())
        );
    }

    #[tokio::test]
    async fn a_second_take_fails_naming_the_holder_and_the_name_frees_on_drop() {
        let name = unique("second");
        let first = take(&name, Path::new("/tmp/first/gantry.sock")).await.unwrap();
        let err = take(&name, Path::new("/tmp/second/gantry.sock")).await.unwrap_err();
        let LockError::Held(h) = &err else { panic!("{err}") };
        assert_eq!((h.uid, h.pid), (nix::unistd::getuid().as_raw(), std::process::id()));
        assert_eq!(h.socket.as_deref(), Some(Path::new("/tmp/first/gantry.sock")));
        let me = crate::access::user_name(h.uid);
        assert_eq!(
            err.to_string(),
            format!("the Gantry engine of {me} (pid {}, socket /tmp/first/gantry.sock) already manages this machine's GPUs: use it, or ask an admin to install the Gantry service", std::process::id())
        );
        drop(first);
        tokio::task::yield_now().await;
        let again = take(&name, Path::new("/tmp/third/gantry.sock")).await;
        assert!(again.is_ok(), "the name is free once the holder is gone: {again:?}");
        assert_eq!(holder(&unique("nobody")).await.unwrap(), None);
    }

    #[tokio::test]
    async fn the_holder_answers_one_json_line_with_uid_pid_and_socket() {
        let name = unique("wire");
        let _l = take(&name, Path::new("/srv/q/gantry.sock")).await.unwrap();
        let line = tokio::task::spawn_blocking(move || {
            let mut s = StdStream::connect_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        })
        .await
        .unwrap();
        assert!(line.ends_with('\n') && line.lines().count() == 1, "{line:?}");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            v,
            serde_json::json!({ "uid": nix::unistd::getuid().as_raw(), "pid": std::process::id(), "socket": "/srv/q/gantry.sock" })
        );
    }
}
