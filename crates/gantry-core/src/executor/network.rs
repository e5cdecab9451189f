//! Each user's own Docker bridge network: made on demand before a container is created on it,
//! removed with its last container, under a machine-wide lock shared by every engine.

use std::collections::HashMap;
use std::time::Duration;

use bollard::query_parameters as qp;

use super::{classify, user_network, DockerExecutor, ExecError, LABEL_NETWORK_UID};

/// Held by any engine on this machine while it makes a user's network and creates a container on
/// it, or looks whether one is unused and removes it: Docker (before API 1.44) lets two engines make
/// two networks of one name, and removes a network a created, not yet started, container is on. A
/// `flock` on one file every engine of the same kind opens (root's in `/run`, others' in `/tmp`; no
/// link followed, never written); whoever else holds it is waited for at most [`NETWORK_LOCK_WAIT`], then the engine goes on without (ids are deduplicated
/// and a vanished network retried anyway), so no user can stall the engine by holding it.
pub(super) struct NetworkLock {
    _held: Option<std::fs::File>,
}

/// Where root's engines meet: `/run` is root's own (0755), so no other user can make or hold the
/// file there and delay a root engine's network changes.
const NETWORK_LOCK_ROOT: &str = "/run/gantry-networks.lock";
/// Where an engine that is not root (a user in the docker group running their own) meets others
/// like it: any user can create and hold this one, so it is only ever waited for a bounded time.
const NETWORK_LOCK_USER: &str = "/tmp/.gantry-networks.lock";
const NETWORK_LOCK_WAIT: Duration = Duration::from_secs(10);

/// The lock file for an engine running as `euid`.
fn network_lock_path(euid: u32) -> &'static str {
    if euid == 0 {
        NETWORK_LOCK_ROOT
    } else {
        NETWORK_LOCK_USER
    }
}

impl NetworkLock {
    pub(super) async fn take() -> NetworkLock {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        let path = network_lock_path(nix::unistd::geteuid().as_raw());
        let Ok(f) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .or_else(|_| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(path)
            })
        else {
            return NetworkLock { _held: None };
        };
        let began = std::time::Instant::now();
        loop {
            // SAFETY: flock on an fd this function owns.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return NetworkLock { _held: Some(f) };
            }
            if began.elapsed() > NETWORK_LOCK_WAIT {
                tracing::warn!(
                    "{path} stayed locked for {}s; going on without it",
                    NETWORK_LOCK_WAIT.as_secs()
                );
                return NetworkLock { _held: None };
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl DockerExecutor {
    /// The id of user `uid`'s network, made if missing (a bridge, labeled, with outbound access).
    /// Docker before API 1.44 lets two engines make two networks of one name at the same moment:
    /// every engine then uses the one with the smallest id and removes its own extra one.
    /// Called with `networks` held.
    pub(super) async fn ensure_network(&self, uid: u32) -> Result<String, ExecError> {
        let name = user_network(uid);
        let find = || async {
            let filters = HashMap::from([("name".to_string(), vec![name.clone()])]);
            let list = self
                .docker
                .list_networks(Some(qp::ListNetworksOptions { filters: Some(filters) }))
                .await
                .map_err(classify)?;
            // `name` filters by substring: only the exact name counts.
            let mut ids: Vec<String> = list
                .into_iter()
                .filter(|n| n.name.as_deref() == Some(name.as_str()))
                .filter_map(|n| n.id)
                .collect();
            ids.sort();
            Ok::<_, ExecError>(ids)
        };
        let ids = find().await?;
        if let Some(id) = ids.first().cloned() {
            // Extra ones of the same name (two engines made it at once): removed while unused.
            for extra in &ids[1..] {
                let _ = self.docker.remove_network(extra).await;
            }
            return Ok(id);
        }
        let req = bollard::models::NetworkCreateRequest {
            name: name.clone(),
            driver: Some("bridge".into()),
            labels: Some(HashMap::from([(LABEL_NETWORK_UID.to_string(), uid.to_string())])),
            ..Default::default()
        };
        let mine = self.docker.create_network(req).await.map_err(classify)?.id;
        let ids = find().await?;
        let first = ids.first().cloned().unwrap_or_else(|| mine.clone());
        for extra in ids.iter().filter(|i| **i != first) {
            let _ = self.docker.remove_network(extra).await;
        }
        tracing::info!("made network {name} for uid {uid}'s jobs");
        Ok(first)
    }

    /// Remove a user's network (by name or id) once no container of any state is on it; Docker
    /// itself refuses while one is attached.
    pub(super) async fn remove_network_if_unused(&self, network: &str) {
        let _one = self.networks.lock().await;
        let _all = NetworkLock::take().await;
        let Ok(info) = self
            .docker
            .inspect_network(network, None::<qp::InspectNetworkOptions>)
            .await
        else {
            return;
        };
        if !info.labels.as_ref().is_some_and(|l| l.contains_key(LABEL_NETWORK_UID)) {
            return;
        }
        let Some(id) = info.id else { return };
        // By name: Docker 20.10 lists a created, not yet started, container under its network's
        // name only (its NetworkID is filled in at start), so a filter by id missed another engine's
        // container between its create and its start and removed the network under it.
        let Some(name) = info.name else { return };
        let filters = HashMap::from([("network".to_string(), vec![name])]);
        let opts = qp::ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        };
        match self.docker.list_containers(Some(opts)).await {
            Ok(list) if list.is_empty() => {
                if let Err(e) = self.docker.remove_network(&id).await {
                    tracing::debug!("network {network} stays: {e}");
                }
            }
            _ => {}
        }
    }
}
