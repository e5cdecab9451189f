//! Fault injection for the fault tests: a tiny tmpfs to fill up, a Docker socket proxy that can
//! cut the engine off from Docker, and small readers for job output.

use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Engine;

/// A tmpfs of a fixed size, mounted on a fresh directory; unmounted on drop.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::Builder::new().prefix("gantry-tmpfs-").tempdir().unwrap();
        let out = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755"), "tmpfs"]).arg(dir.path()).output().unwrap();
        assert!(out.status.success(), "mount tmpfs (needs root): {}", String::from_utf8_lossy(&out.stderr));
        Tmpfs { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Write `filler` until the file system is full; returns its path (delete it to free the space).
    pub fn fill(&self) -> PathBuf {
        let p = self.path().join("filler");
        let mut f = std::fs::File::create(&p).unwrap();
        let chunk = vec![0x5a; 64 << 10];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                Err(e) => panic!("filling {}: {e}", p.display()),
            }
        }
        p
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount").arg(self.path()).status().is_ok_and(|s| s.success());
        if !ok {
            // Something still holds a file open: detach now, the kernel frees it when closed.
            let _ = Command::new("umount").arg("-l").arg(self.path()).status();
        }
    }
}

/// A Unix-socket proxy in front of the real Docker socket. `cut` hangs up every connection and
/// refuses new ones (to the engine, Docker is gone); `restore` lets connections through again.
pub struct DockerProxy {
    dir: tempfile::TempDir,
    shared: Arc<ProxyShared>,
    accept: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct ProxyShared {
    up: AtomicBool,
    stop: AtomicBool,
    /// Both ends of every connection passed through, to hang them up on `cut`.
    conns: Mutex<Vec<UnixStream>>,
}

impl DockerProxy {
    pub fn start() -> DockerProxy {
        let dir = tempfile::Builder::new().prefix("gantry-docker-proxy-").tempdir().unwrap();
        let listener = UnixListener::bind(dir.path().join("docker.sock")).unwrap();
        let shared = Arc::new(ProxyShared { up: AtomicBool::new(true), ..Default::default() });
        let s = shared.clone();
        let accept = std::thread::spawn(move || {
            for client in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                // Under the lock, so a connection is either refused or hung up by `cut`, never missed.
                let mut conns = s.conns.lock().unwrap();
                if !s.up.load(Ordering::SeqCst) {
                    continue; // dropped: the client sees the connection closed at once
                }
                let Ok(upstream) = UnixStream::connect("/var/run/docker.sock") else { continue };
                conns.extend([client.try_clone().unwrap(), upstream.try_clone().unwrap()]);
                pipe(client.try_clone().unwrap(), upstream.try_clone().unwrap());
                pipe(upstream, client);
            }
        });
        DockerProxy { dir, shared, accept: Some(accept) }
    }

    /// Value for `DOCKER_HOST`.
    pub fn docker_host(&self) -> String {
        format!("unix://{}", self.dir.path().join("docker.sock").display())
    }

    pub fn cut(&self) {
        let mut conns = self.shared.conns.lock().unwrap();
        self.shared.up.store(false, Ordering::SeqCst);
        for c in conns.drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn restore(&self) {
        self.shared.up.store(true, Ordering::SeqCst);
    }
}

fn pipe(mut from: UnixStream, mut to: UnixStream) {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
}

impl Drop for DockerProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.cut();
        let _ = UnixStream::connect(self.dir.path().join("docker.sock")); // wake the accept loop
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Removes the given containers on drop (ones no engine of this test will clean up).
pub struct RemoveContainers(pub Vec<String>);

impl Drop for RemoveContainers {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            let _ = Command::new("docker").args(["rm", "-f"]).args(&self.0).output();
        }
    }
}

/// A shell command printing `tick-1` .. `tick-N`, one every `every` seconds.
pub fn ticker(n: u32, every: &str) -> String {
    format!("i=1; while [ $i -le {n} ]; do echo tick-$i; i=$((i+1)); sleep {every}; done")
}

/// The numbers of the `tick-N` lines in a log, in order (the command's own `tick-$i` is skipped).
pub fn ticks(log: &str) -> Vec<u32> {
    log.lines().filter_map(|l| l.rsplit_once("tick-").and_then(|(_, n)| n.trim_end().parse().ok())).collect()
}

pub fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

impl Engine {
    /// `wait_until` with a longer limit, for work that takes minutes on a small machine.
    pub fn wait_long(&self, what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < limit, "timed out after {limit:?} waiting for {what}\n{}", self.daemon_log());
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}
