//! `gantry open ID [PORT]`: a job's served port (`ports` in its spec: a notebook, TensorBoard)
//! reached through a loopback port of this machine that only the job's owner may use.
//!
//! The engine listens on `127.0.0.1:<free port>` (never another address) for as long as the job
//! runs. Loopback is shared by every user of the machine, so each connection's peer is looked up
//! in `/proc/net/tcp`: the kernel records the uid that made each socket, and a connection whose
//! socket is not the owner's is closed before a byte is read or sent. (The alternative, a proxy
//! through the Unix socket, needs a client process running for as long as the URL is used; this
//! way a browser opens the URL directly, and over SSH `ssh -L` reaches the same port as the ssh
//! user, the owner.) The engine reaches the port inside the container's own network namespace at
//! 127.0.0.1 (see `Executor::connect_port`), so the server inside need not listen on any address
//! the host's other users could reach.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

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
    #[error(transparent)]
    Engine(#[from] EngineError),
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
        if let Some(addr) = self.forwards.lock().unwrap().get(&(id, port)) {
            return Ok(Opened {
                job_id: id,
                port,
                address: addr.to_string(),
                url: url(*addr),
            });
        }
        let listener = tokio::net::TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(EngineError::from)?;
        let addr = listener.local_addr().map_err(EngineError::from)?;
        self.forwards.lock().unwrap().insert((id, port), addr);
        info!(job = id, "port {port} of job {id} forwarded from {addr} for its owner");
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

    /// Accept the owner's connections until the job ends (checked every second).
    async fn forward(self: &Arc<Self>, id: i64, owner: u32, port: u16, run: RunRef, listener: tokio::net::TcpListener) {
        let Ok(SocketAddr::V4(ours)) = listener.local_addr() else {
            return;
        };
        loop {
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
                info!(job = id, "refused a connection to job {id}'s port {port} from uid {uid:?}: only its owner (uid {owner}) may connect");
                drop(client);
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
}
