//! Fault injection for the fault tests: a tiny tmpfs to fill up, a Docker socket proxy that can
//! cut the engine off from Docker or keep a `docker start` in flight, a proxy in front of the
//! engine's API that loses an answer, and small readers for job output.

use std::io::{Read, Write};
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
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755"), "tmpfs"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mount tmpfs (needs root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
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
        let ok = Command::new("umount")
            .arg(self.path())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            // Something still holds a file open: detach now, the kernel frees it when closed.
            let _ = Command::new("umount").arg("-l").arg(self.path()).status();
        }
    }
}

/// A Unix-socket proxy in front of the real Docker socket. `cut` hangs up every connection and
/// refuses new ones (to the engine, Docker is gone); `restore` lets connections through again;
/// `hold_next_start` keeps a `docker start` in flight.
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
    /// The next container start is held (see `hold_next_start`).
    hold: AtomicBool,
    /// Held starts: (container id, the request).
    held: Mutex<Vec<(String, Vec<u8>)>>,
    /// Runs once a held start went through, before the request that let it go.
    after_start: Mutex<Option<Box<dyn Fn() + Send>>>,
}

impl DockerProxy {
    pub fn start() -> DockerProxy {
        let dir = tempfile::Builder::new()
            .prefix("gantry-docker-proxy-")
            .tempdir()
            .unwrap();
        let listener = UnixListener::bind(dir.path().join("docker.sock")).unwrap();
        let shared = Arc::new(ProxyShared {
            up: AtomicBool::new(true),
            ..Default::default()
        });
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
                let Ok(upstream) = UnixStream::connect("/var/run/docker.sock") else {
                    continue;
                };
                conns.extend([client.try_clone().unwrap(), upstream.try_clone().unwrap()]);
                forward_requests(client.try_clone().unwrap(), upstream.try_clone().unwrap(), s.clone());
                pipe(upstream, client);
            }
        });
        DockerProxy {
            dir,
            shared,
            accept: Some(accept),
        }
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

    /// The next `POST …/containers/ID/start` is held: it does not reach Docker yet, and the engine
    /// that sent it waits for an answer (kill it now and it dies inside `start`). It goes through
    /// on a connection of its own, the way dockerd finishes a start whose client died, as soon as
    /// any request names that container (inspect, logs, remove: Docker serves those only once a
    /// start in flight has finished); then `after_start` runs (e.g. wait for the job's first
    /// output), then that request. Listing containers lets nothing through: Docker's list says
    /// `created` while a start is in flight.
    pub fn hold_next_start(&self, after_start: impl Fn() + Send + 'static) {
        *self.shared.after_start.lock().unwrap() = Some(Box::new(after_start));
        self.shared.hold.store(true, Ordering::SeqCst);
    }

    /// How many starts are held now.
    pub fn held_starts(&self) -> usize {
        self.shared.held.lock().unwrap().len()
    }
}

/// `(method, path)` of the request that begins `chunk`, if one does.
fn request_line(chunk: &[u8]) -> Option<(String, String)> {
    let line = chunk.split(|b| *b == b'\r').next()?;
    let mut parts = std::str::from_utf8(line).ok()?.split(' ');
    let (method, path, version) = (parts.next()?, parts.next()?, parts.next()?);
    version
        .starts_with("HTTP/")
        .then(|| (method.to_string(), path.to_string()))
}

/// The container id of a `…/containers/ID/start` path.
fn started_container(path: &str) -> Option<String> {
    let rest = path.split('?').next()?.split_once("/containers/")?.1;
    rest.strip_suffix("/start")
        .filter(|id| !id.contains('/'))
        .map(String::from)
}

/// Client -> Docker, request by request (one write each: no client pipelines), holding and letting
/// go of starts as [`DockerProxy::hold_next_start`] says.
fn forward_requests(mut from: UnixStream, mut to: UnixStream, s: Arc<ProxyShared>) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            if let Some((method, path)) = request_line(chunk) {
                let start = started_container(&path).filter(|_| method == "POST");
                if let Some(id) = start.filter(|_| s.hold.swap(false, Ordering::SeqCst)) {
                    s.held.lock().unwrap().push((id, chunk.to_vec()));
                    continue; // its sender waits for an answer that never comes
                }
                let mut held = s.held.lock().unwrap();
                let names = |id: &str| {
                    path.split('?').next().is_some_and(|p| {
                        p.contains(&format!("/containers/{id}/")) || p.ends_with(&format!("/containers/{id}"))
                    })
                };
                if let Some(i) = held.iter().position(|(id, _)| names(id)) {
                    let (_, request) = held.remove(i);
                    drop(held);
                    let mut docker = UnixStream::connect("/var/run/docker.sock").unwrap();
                    docker.write_all(&request).unwrap();
                    let mut answer = vec![];
                    let mut b = [0u8; 1024];
                    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
                        let n = docker.read(&mut b).unwrap();
                        assert!(n > 0, "Docker hung up on the held start");
                        answer.extend_from_slice(&b[..n]);
                    }
                    if let Some(after) = s.after_start.lock().unwrap().as_ref() {
                        after();
                    }
                }
            }
            if to.write_all(chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
}

/// A Unix-socket proxy in front of an engine's API, for a CLI run with `--state-dir`
/// [`ApiProxy::state_dir`] (it connects as the test's own user, so the engine sees that uid). After
/// `lose_next_answer`, the next request goes to the engine, which answers; the answer is read and
/// never passed on, and the client waits until `hang_up`, when its connection ends before any
/// answer: what a client sees when the engine crashes right after committing.
pub struct ApiProxy {
    dir: tempfile::TempDir,
    shared: Arc<ApiShared>,
    accept: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct ApiShared {
    stop: AtomicBool,
    lose: AtomicBool,
    /// Clients whose answer was lost, left waiting.
    waiting: Mutex<Vec<UnixStream>>,
    lost: AtomicBool,
}

impl ApiProxy {
    pub fn start(engine_socket: &Path) -> ApiProxy {
        let dir = tempfile::Builder::new().prefix("gantry-api-proxy-").tempdir().unwrap();
        let listener = UnixListener::bind(dir.path().join("gantry.sock")).unwrap();
        let shared = Arc::new(ApiShared::default());
        let (s, engine) = (shared.clone(), engine_socket.to_path_buf());
        let accept = std::thread::spawn(move || {
            for client in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(upstream) = UnixStream::connect(&engine) else {
                    continue;
                }; // no engine: hung up
                pipe(client.try_clone().unwrap(), upstream.try_clone().unwrap());
                if !s.lose.swap(false, Ordering::SeqCst) {
                    pipe(upstream, client);
                    continue;
                }
                s.waiting.lock().unwrap().push(client);
                let s = s.clone();
                std::thread::spawn(move || {
                    let mut upstream = upstream;
                    let mut b = [0u8; 4096];
                    while let Ok(n) = upstream.read(&mut b) {
                        if n == 0 {
                            break;
                        }
                        s.lost.store(true, Ordering::SeqCst);
                    }
                });
            }
        });
        ApiProxy {
            dir,
            shared,
            accept: Some(accept),
        }
    }

    /// For `gantry --state-dir`: its `gantry.sock` is the proxy.
    pub fn state_dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn lose_next_answer(&self) {
        self.shared.lose.store(true, Ordering::SeqCst);
    }

    /// Whether the engine answered a request whose answer is being kept from its client.
    pub fn answer_lost(&self) -> bool {
        self.shared.lost.load(Ordering::SeqCst)
    }

    /// End the connections of the clients whose answer was lost.
    pub fn hang_up(&self) {
        for c in self.shared.waiting.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Drop for ApiProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.hang_up();
        let _ = UnixStream::connect(self.dir.path().join("gantry.sock"));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
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
    log.lines()
        .filter_map(|l| l.rsplit_once("tick-").and_then(|(_, n)| n.trim_end().parse().ok()))
        .collect()
}

pub fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

impl Engine {
    /// `wait_until` with a longer limit, for work that takes minutes on a small machine.
    pub fn wait_long(&self, what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(
                t.elapsed() < limit,
                "timed out after {limit:?} waiting for {what}\n{}",
                self.daemon_log()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}
