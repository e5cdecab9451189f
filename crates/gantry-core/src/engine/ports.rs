//! `gantry open ID [PORT]`: a job's served port (`ports` in its spec: a notebook, TensorBoard)
//! reached through a loopback address of this machine that only the job's owner may use.
//!
//! The URL must never be answered by anyone but the engine, also while the engine is not listening (a
//! restart, the job's end, a preemption): a browser tab keeps sending its notebook token and cookies to
//! the same address (issue 29, hole 1). So a root engine listens on a port below 1024, which only root
//! may bind (`[sessions] forward_port`, 1021 by default), on an address of the job's own in 127.0.0.0/8
//! ([`forward_ip`]: the same for the same database, job and port, so the URL survives a restart, and
//! another engine's forwards take other addresses). After a restart the engine binds the forwards of
//! every running job again before anything else, so an open tab goes on working. When the engine or
//! the job is gone, the URL is refused: no other user can bind it.
//!
//! Loopback is shared by every user of the machine, so each connection's peer is looked up in
//! `/proc/net/tcp`: the kernel records the uid that made each socket, and a connection whose socket is
//! not the owner's is closed before a byte is read or sent (logged once per uid, then summed up, so a
//! connect flood costs a line a minute). (The alternative, a proxy through the Unix socket, needs a
//! client process running for as long as the URL is used; this way a browser opens the URL directly,
//! and over SSH `ssh -L` reaches the same address as the ssh user, the owner.) The engine reaches the
//! port inside the container's own network namespace at 127.0.0.1 (see `Executor::connect_port`), so
//! the server inside need not listen on any address the host's other users could reach.
//!
//! An engine that is not root cannot bind a port below 1024: it listens on a free port of 127.0.0.1
//! (such an engine serves only its own user, and says in its log that the URL is not kept).

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use tracing::{debug, info, warn};

use super::{Engine, EngineError};
use crate::protocol::terminal::Opened;
use crate::store::{JobState, RunRef};

/// Why a port cannot be opened, for the API to answer with.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("job {job} belongs to {owner}; only its owner can open its ports")]
    NotOwner { job: i64, owner: String },
    #[error("job {0} serves no ports: list them in its spec (`ports: [8888]`, `gantry run --port 8888`)")]
    NoPorts(i64),
    #[error("job {job} serves {}, not port {port}", list(.ports))]
    NotServed { job: i64, port: u16, ports: Vec<u16> },
    #[error("job {job} is {}; its ports open while it runs", state.as_str())]
    NotRunning { job: i64, state: JobState },
    #[error(
        "port {port} is taken on every loopback address tried for job {job}'s forward; set `[sessions] \
         forward_port` in the lab config to a port below 1024 that no service on this machine listens on"
    )]
    Taken { job: i64, port: u16 },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Addresses tried for one forward before it is given up (another engine's forward, a service).
const FORWARD_TRIES: u32 = 8;

/// The loopback address of try `k` of the forward of `port` of job `job` in database `db_uid`:
/// 127.A.B.C with A from 1 to 254 (never 127.0.x.x, where this machine's own services listen:
/// 127.0.0.1, 127.0.0.53, 127.0.1.1) and C from 1 to 254. The same inputs give the same address.
pub fn forward_ip(db_uid: &str, job: i64, port: u16, k: u32) -> Ipv4Addr {
    // FNV-1a: stable across Rust versions and machines, unlike the std hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in format!("{db_uid}/{job}/{port}/{k}").bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    Ipv4Addr::new(127, 1 + (h % 254) as u8, (h >> 16) as u8, 1 + ((h >> 32) % 254) as u8)
}

/// `net.ipv4.ip_unprivileged_port_start`: the lowest port any user may bind (1024 unless changed).
fn unprivileged_port_start() -> Option<u16> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Another user's connections to a forward, for the log: the first from each uid gets a line, the
/// rest are summed up at most every [`crate::config::FORWARD_REFUSED_LOG_EVERY`].
#[derive(Debug)]
pub struct Refusals {
    every: Duration,
    named: HashSet<Option<u32>>,
    unlogged: u64,
    since: Option<Instant>,
}

/// Distinct uids named in the log per forward; past it, every refusal goes into the sums.
const REFUSALS_NAMED: usize = 64;

impl Refusals {
    pub fn new(every: Duration) -> Refusals {
        Refusals {
            every,
            named: HashSet::new(),
            unlogged: 0,
            since: None,
        }
    }

    /// A refused connection from `uid` at `now`: whether it gets a line of its own.
    pub fn refused(&mut self, uid: Option<u32>, now: Instant) -> bool {
        if self.named.len() < REFUSALS_NAMED && self.named.insert(uid) {
            return true;
        }
        self.unlogged += 1;
        self.since.get_or_insert(now);
        false
    }

    /// The refusals not logged yet, once [`Refusals::every`] has passed since the first of them.
    pub fn summary(&mut self, now: Instant) -> Option<u64> {
        let since = self.since?;
        if now.duration_since(since) < self.every {
            return None;
        }
        self.since = None;
        Some(std::mem::take(&mut self.unlogged))
    }
}

fn list(ports: &[u16]) -> String {
    let p: Vec<String> = ports.iter().map(|p| p.to_string()).collect();
    format!("port{} {}", if p.len() == 1 { "" } else { "s" }, p.join(", "))
}

/// The uid that made the socket at `peer` connected to `ours`, from the text of `/proc/net/tcp`
/// (`sl local rem st queues tr retrnsmt uid …`, addresses as little-endian hex `0100007F:1F90`).
pub fn peer_uid(proc_net_tcp: &str, peer: SocketAddrV4, ours: SocketAddrV4) -> Option<u32> {
    let hex = |a: SocketAddrV4| format!("{:08X}:{:04X}", u32::from_le_bytes(a.ip().octets()), a.port());
    let (want_local, want_remote) = (hex(peer), hex(ours));
    proc_net_tcp.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 7 && f[1].eq_ignore_ascii_case(&want_local) && f[2].eq_ignore_ascii_case(&want_remote))
            .then(|| f[7].parse().ok())
            .flatten()
    })
}

impl Engine {
    /// A loopback URL reaching `port` (default: the job's first) of job `id`, which `caller` owns
    /// and which runs: the same one for as long as the job runs.
    pub async fn open_port(self: &Arc<Self>, id: i64, caller: u32, port: Option<u16>) -> Result<Opened, OpenError> {
        let d = self.job_detail(id)?;
        let job = &d.job;
        if job.owner_uid != caller {
            return Err(OpenError::NotOwner {
                job: id,
                owner: job.owner.clone(),
            });
        }
        let ports = job.job.spec.ports.clone();
        let port = match port {
            None => *ports.first().ok_or(OpenError::NoPorts(id))?,
            Some(p) if ports.contains(&p) => p,
            Some(_) if ports.is_empty() => return Err(OpenError::NoPorts(id)),
            Some(p) => {
                return Err(OpenError::NotServed {
                    job: id,
                    port: p,
                    ports,
                })
            }
        };
        let attempt = d.attempts.last().filter(|a| a.ended_at.is_none());
        let run = self
            .running
            .lock()
            .unwrap()
            .get(&id)
            .and_then(|h| h.run.clone())
            .or_else(|| attempt.and_then(|a| a.container_id.clone()).map(RunRef::Container));
        let (JobState::Running, Some(run)) = (job.state, run) else {
            return Err(OpenError::NotRunning {
                job: id,
                state: job.state,
            });
        };
        let token = job.job.spec.env.get("JUPYTER_TOKEN").cloned();
        let url = |addr: SocketAddr| match &token {
            Some(t) => format!("http://{addr}/lab?token={t}"),
            None => format!("http://{addr}/"),
        };
        let (listener, addr) = {
            let mut forwards = self.forwards.lock().unwrap();
            if let Some(addr) = forwards.get(&(id, port)) {
                return Ok(Opened {
                    job_id: id,
                    port,
                    address: addr.to_string(),
                    url: url(*addr),
                });
            }
            // Bound here, under the lock: two opens at once get the same forward.
            let listener = self.bind_forward(id, port)?;
            let addr = listener.local_addr().map_err(EngineError::from)?;
            forwards.insert((id, port), addr);
            (listener, addr)
        };
        info!(job = id, "port {port} of job {id} forwarded from {addr} for its owner");
        let listener = tokio::net::TcpListener::from_std(listener).map_err(EngineError::from)?;
        let e = self.clone();
        let owner = job.owner_uid;
        self.tasks.spawn(async move {
            e.forward(id, owner, port, run, listener).await;
            e.forwards.lock().unwrap().remove(&(id, port));
        });
        Ok(Opened {
            job_id: id,
            port,
            address: addr.to_string(),
            url: url(addr),
        })
    }

    /// The listener of a new forward: `[sessions] forward_port` on the job's own loopback address (see
    /// the module's comment); a free port of 127.0.0.1 for an engine that is not root.
    fn bind_forward(&self, id: i64, port: u16) -> Result<std::net::TcpListener, OpenError> {
        let bind = |a: SocketAddrV4| {
            let l = std::net::TcpListener::bind(a)?;
            l.set_nonblocking(true)?;
            Ok::<_, std::io::Error>(l)
        };
        let fixed = self.policy().sessions.forward_port;
        if nix::unistd::geteuid().is_root() {
            if unprivileged_port_start().is_some_and(|start| fixed >= start) {
                warn!(
                    "forward port {fixed} is not below net.ipv4.ip_unprivileged_port_start on this machine: other \
                     users may bind it when the engine is not listening; set that sysctl to 1024"
                );
            }
            for k in 0..FORWARD_TRIES {
                let at = SocketAddrV4::new(forward_ip(&self.db_uid, id, port, k), fixed);
                match bind(at) {
                    Ok(l) => return Ok(l),
                    Err(err) if err.kind() == std::io::ErrorKind::AddrInUse => {
                        debug!(job = id, "forward address {at} is taken; trying another")
                    }
                    Err(err) => return Err(EngineError::from(err).into()),
                }
            }
            return Err(OpenError::Taken { job: id, port: fixed });
        }
        warn!(
            job = id,
            "this engine is not root: port {port} of job {id} is forwarded from a free port of 127.0.0.1, \
             which another user may bind once the forward ends"
        );
        Ok(bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).map_err(EngineError::from)?)
    }

    /// At start-up, once recovery has followed the running jobs again: their forwards listen again at
    /// the same addresses, before an open browser tab's next request.
    pub(super) async fn reopen_forwards(self: &Arc<Self>) {
        let ids: Vec<i64> = self.running.lock().unwrap().keys().copied().collect();
        for id in ids {
            let Ok(d) = self.job_detail(id) else { continue };
            if d.job.state != JobState::Running {
                continue;
            }
            for port in d.job.job.spec.ports.clone() {
                if let Err(err) = self.open_port(id, d.job.owner_uid, Some(port)).await {
                    warn!(job = id, "cannot forward port {port} of job {id} again: {err}");
                }
            }
        }
    }

    /// Accept the owner's connections until the job ends (checked every second).
    async fn forward(self: &Arc<Self>, id: i64, owner: u32, port: u16, run: RunRef, listener: tokio::net::TcpListener) {
        let Ok(SocketAddr::V4(ours)) = listener.local_addr() else {
            return;
        };
        let mut refusals = Refusals::new(crate::config::FORWARD_REFUSED_LOG_EVERY);
        loop {
            if let Some(n) = refusals.summary(Instant::now()) {
                info!(
                    job = id,
                    "refused {n} more connections to job {id}'s port {port} from other users in the last {}s",
                    refusals.every.as_secs()
                );
            }
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {
                    let over = self.job_detail(id).map(|d| d.job.state != JobState::Running).unwrap_or(true);
                    if over || self.shutdown.is_cancelled() {
                        debug!(job = id, "the forward of port {port} ends with the job");
                        return;
                    }
                    continue;
                }
            };
            let (client, peer) = match accepted {
                Ok(c) => c,
                Err(err) => {
                    warn!(job = id, "accepting on the forward of port {port} failed: {err}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let SocketAddr::V4(peer) = peer else { continue };
            let uid = tokio::fs::read_to_string("/proc/net/tcp")
                .await
                .ok()
                .and_then(|t| peer_uid(&t, peer, ours));
            if uid != Some(owner) {
                drop(client);
                if refusals.refused(uid, Instant::now()) {
                    info!(
                        job = id,
                        "refused a connection to job {id}'s port {port} from uid {uid:?}: only its owner (uid {owner}) \
                         may connect (more from this uid are summed up)"
                    );
                }
                continue;
            }
            let e = self.clone();
            let run = run.clone();
            tokio::spawn(async move {
                let mut client = client;
                match e.backend.connect_port(&run, port).await {
                    Ok(mut inside) => {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut inside).await;
                    }
                    Err(err) => debug!(job = id, "cannot reach port {port} in the container: {err}"),
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peers_uid_is_read_from_proc_net_tcp() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
           0: 0100007F:8AE6 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0\n\
           1: 0100007F:D431 0100007F:8AE6 01 00000000:00000000 00:00000000 00000000  1001        0 2 1 0000000000000000 20 4 30 10 -1\n\
           2: 0100007F:8AE6 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 20 4 30 10 -1\n";
        let ours = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0x8AE6);
        let peer = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0xD431);
        assert_eq!(
            peer_uid(text, peer, ours),
            Some(1001),
            "the client's socket, not the engine's end of it"
        );
        assert_eq!(
            peer_uid(text, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1), ours),
            None,
            "a socket gone"
        );
        assert_eq!(
            peer_uid(text, SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 0xD431), ours),
            None
        );
        assert_eq!(list(&[8888]), "port 8888");
        assert_eq!(list(&[8888, 6006]), "ports 8888, 6006");
    }

    #[test]
    fn a_forwards_address_is_its_own_in_127_slash_8_and_the_same_after_a_restart() {
        let a = forward_ip("db1", 7, 8888, 0);
        assert_eq!(a, forward_ip("db1", 7, 8888, 0), "the same URL after a restart");
        let mut seen = HashSet::new();
        for (db, job, port, k) in [
            ("db1", 7, 8888, 1),
            ("db2", 7, 8888, 0),
            ("db1", 8, 8888, 0),
            ("db1", 7, 6006, 0),
        ] {
            seen.insert(forward_ip(db, job, port, k));
        }
        seen.insert(a);
        assert_eq!(seen.len(), 5, "{seen:?}");
        for job in 0..2000 {
            let o = forward_ip("db1", job, 8888, 0).octets();
            assert!(
                o[0] == 127 && o[1] != 0 && o[1] != 255 && o[3] != 0 && o[3] != 255,
                "{o:?}"
            );
        }
    }

    #[test]
    fn refused_connections_get_a_line_per_uid_then_a_sum_a_minute() {
        let t0 = Instant::now();
        let mut r = Refusals::new(Duration::from_secs(60));
        assert!(r.refused(Some(1002), t0), "the first from bob is logged");
        assert!(!r.refused(Some(1002), t0));
        assert!(r.refused(None, t0), "an unknown peer is named once too");
        for i in 0..8758 {
            assert!(!r.refused(Some(1002), t0 + Duration::from_millis(i)));
        }
        assert_eq!(
            r.summary(t0 + Duration::from_secs(30)),
            None,
            "not before a minute has passed"
        );
        assert_eq!(r.summary(t0 + Duration::from_secs(60)), Some(8759));
        assert_eq!(
            r.summary(t0 + Duration::from_secs(200)),
            None,
            "nothing new, nothing logged"
        );
    }
}
