//! The cluster's GPUs for the GPUs view: one entry per GPU of each node (index counts across nodes),
//! the node named in its name; which are allocated comes from Slurm, live figures from the node's
//! agent where it runs one.

use super::Shared;
use crate::engine::Engine;
use crate::gpu::GpuSample;
use crate::protocol::GpuUser;
use crate::slurm::{self as sl, SqJob};
use crate::store::RunRef;

/// The cluster's GPUs, the job ids on each GPU (by index), and who uses them.
type ClusterGpus = (Vec<GpuSample>, Vec<(u32, Vec<i64>)>, Vec<GpuUser>);

pub(super) fn cluster_gpus(e: &Engine, s: &Shared) -> ClusterGpus {
    let nodes = s.nodes.read().unwrap().clone();
    let snap = s.snapshot.borrow().clone();
    let mut gpus = vec![];
    let mut holders = vec![];
    let mut users = vec![];
    let ours: Vec<(i64, &SqJob)> = {
        let r = e.running.lock().unwrap();
        r.iter()
            .filter_map(|(jid, h)| match h.run {
                Some(RunRef::Slurm { id, task }) => sl::find_job(&snap.jobs, id, task).map(|j| (*jid, j)),
                _ => None,
            })
            .collect()
    };
    let mut index = 0u32;
    let now = e.now();
    for n in &nodes {
        let live = s
            .settings
            .node_samples
            .as_deref()
            .and_then(|d| crate::node_agent::read(d, &n.name, now));
        for g in 0..n.gpus {
            let name = format!(
                "{} GPU {g}{} (Slurm node, {})",
                n.name,
                n.gpu_type.as_deref().map(|t| format!(" {t}")).unwrap_or_default(),
                n.state.to_lowercase()
            );
            let mut s = GpuSample {
                index,
                uuid: format!("slurm:{}:{g}", n.name),
                name,
                memory_total: 0,
                memory_used: 0,
                utilization: 0,
                temperature_c: None,
                power_w: None,
                processes: vec![],
                mig_parent: None,
                links: vec![],
            };
            // Live figures from the node's agent, when it runs one.
            if let Some(x) = live.as_ref().and_then(|l| l.gpus.iter().find(|x| x.index == g)) {
                s.name = format!(
                    "{} GPU {g}: {} (Slurm node, {})",
                    n.name,
                    x.name,
                    n.state.to_lowercase()
                );
                s.memory_total = x.memory_total;
                s.memory_used = x.memory_used;
                s.utilization = x.utilization;
                s.temperature_c = x.temperature_c;
                s.power_w = x.power_w;
                s.uuid = x.uuid.clone();
            }
            let mine: Vec<i64> = ours
                .iter()
                .filter(|(_, j)| j.nodes.as_deref() == Some(n.name.as_str()) && j.gpu_indexes().contains(&g))
                .map(|(id, _)| *id)
                .collect();
            if n.gpus_used.contains(&g) && mine.is_empty() {
                users.push(GpuUser {
                    gpu: index,
                    job_id: None,
                    job_name: None,
                    user: None,
                    pid: None,
                    command: Some("allocated by Slurm to another job".into()),
                    container: None,
                    used_memory: None,
                    since: None,
                    idle_since: None,
                });
            }
            if !mine.is_empty() {
                holders.push((index, mine));
            }
            gpus.push(s);
            index += 1;
        }
    }
    (gpus, holders, users)
}
