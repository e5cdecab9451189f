//! `gantry daemon --node-agent DIR`: runs on each Slurm node and writes the node's GPU samples (NVML)
//! to `DIR/<node>.json` every second (written aside, then renamed: readers never see half a file).
//! `DIR` is shared storage the engine reads (`[slurm] node_samples`): the GPUs view of a cluster then
//! shows each node's utilization and memory, and the app draws its live charts from them.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::gpu::GpuSample;
use crate::store::now_ms;

/// Samples older than this are not shown (the agent or its node is down).
pub const FRESH_MS: i64 = 10_000;
const MAX_BYTES: u64 = 4 << 20;

/// What one node's agent writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeSamples {
    pub node: String,
    /// When sampled (ms).
    pub at: i64,
    pub gpus: Vec<GpuSample>,
}

/// The node's short host name, as Slurm's `NodeName` usually is.
pub fn node_name() -> String {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    h.trim().split('.').next().unwrap_or("").to_string()
}

/// Sample the node's GPUs (`gpus`: simulated, as for the engine) every `every` into `dir`, until `stop`.
pub async fn run(
    dir: PathBuf,
    gpus: Option<String>,
    every: Duration,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), crate::gpu::GpuError> {
    let crate::gpu::Opened { mut backend, note, .. } = crate::gpu::open(gpus.as_deref())?;
    if let Some(n) = note {
        warn!("node agent: {n}");
    }
    let node = node_name();
    let (path, tmp) = (dir.join(format!("{node}.json")), dir.join(format!(".{node}.json.tmp")));
    info!(
        "node agent: writing {node}'s GPU samples to {} every {:?}",
        path.display(),
        every
    );
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = tick.tick() => {}
        }
        let gpus = match backend.sample() {
            Ok(g) => g,
            Err(e) => {
                warn!("node agent: sampling failed: {e}");
                continue;
            }
        };
        let body = serde_json::to_vec(&NodeSamples {
            node: node.clone(),
            at: now_ms(),
            gpus,
        })
        .unwrap_or_default();
        if let Err(e) = write_aside(&tmp, &path, &body) {
            warn!("node agent: cannot write {}: {e}", path.display());
        }
    }
}

/// Write `body` to `tmp`, then rename it to `path`. The folder may be shared storage others can write
/// to: whatever is at `tmp` (a link to a file the agent may write, as root) is removed, never followed.
fn write_aside(tmp: &Path, path: &Path, body: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(tmp)?;
    f.write_all(body)?;
    drop(f);
    std::fs::rename(tmp, path)
}

/// A node's samples, if its agent wrote them within [`FRESH_MS`] of `now` (a plain file, not followed
/// through a link, at most 4 MiB, owned by the user this engine runs as: agents run as root like the
/// engine, so a file a user planted in a shared folder they can write is never read as a node's GPUs).
pub fn read(dir: &Path, node: &str, now: i64) -> Option<NodeSamples> {
    use std::os::unix::fs::OpenOptionsExt;
    if node.is_empty() || node.contains('/') || node.starts_with('.') {
        return None;
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(dir.join(format!("{node}.json")))
        .ok()?;
    let md = f.metadata().ok()?;
    if !md.file_type().is_file() || std::os::unix::fs::MetadataExt::uid(&md) != nix::unistd::geteuid().as_raw() {
        return None;
    }
    let mut buf = vec![];
    f.take(MAX_BYTES).read_to_end(&mut buf).ok()?;
    let s: NodeSamples = serde_json::from_slice(&buf).ok()?;
    (now - s.at <= FRESH_MS && s.node == node).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_samples_of_the_named_node_only() {
        let d = tempfile::tempdir().unwrap();
        let s = NodeSamples {
            node: "n1".into(),
            at: 1_000_000,
            gpus: vec![],
        };
        std::fs::write(d.path().join("n1.json"), serde_json::to_vec(&s).unwrap()).unwrap();
        assert_eq!(read(d.path(), "n1", 1_005_000), Some(s.clone()));
        assert_eq!(read(d.path(), "n1", 1_000_000 + FRESH_MS + 1), None, "stale");
        assert_eq!(read(d.path(), "../n1", 1_000_000), None);
        std::os::unix::fs::symlink(d.path().join("n1.json"), d.path().join("n2.json")).unwrap();
        assert_eq!(read(d.path(), "n2", 1_000_000), None, "links are not followed");
        // A user who can write the shared folder plants fake figures for a node: not read.
        let s3 = NodeSamples {
            node: "n3".into(),
            at: 1_000_000,
            gpus: vec![],
        };
        std::fs::write(d.path().join("n3.json"), serde_json::to_vec(&s3).unwrap()).unwrap();
        assert_eq!(read(d.path(), "n3", 1_000_000), Some(s3));
        std::os::unix::fs::chown(
            d.path().join("n3.json"),
            Some(nix::unistd::geteuid().as_raw() + 4242),
            None,
        )
        .unwrap();
        assert_eq!(read(d.path(), "n3", 1_000_000), None, "a file another user owns");
    }

    #[test]
    fn the_agent_never_writes_through_a_link_left_in_the_shared_folder() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let tmp = d.path().join(".n1.json.tmp");
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        write_aside(&tmp, &d.path().join("n1.json"), b"{}").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(d.path().join("n1.json")).unwrap(), "{}");
    }
}
