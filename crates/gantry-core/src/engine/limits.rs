//! CPU and RAM for the scheduler, and each job's container settings, from the lab's `[containers]`.

use super::Engine;
use crate::policy::Policy;
use crate::scheduler::CpuRam;

impl Engine {
    /// CPU and RAM the machine has for jobs under `p` (the machine less the lab's reserve).
    pub(super) fn host_capacity(&self, p: &Policy) -> CpuRam {
        self.machine.for_jobs(&p.containers)
    }

    /// Attempts since `since` weighed for fair share: GPUs, or CPU/RAM in per-GPU shares when more
    /// (`scheduler::gpu_worth`), so CPU-only jobs and CPU-heavy ones count too.
    pub(super) fn usage_worth(&self, since: i64) -> Result<Vec<crate::store::WorthRow>, crate::store::StoreError> {
        let p = self.policy();
        let gpu_count = self.latest.read().unwrap().iter().filter(|g| self.usable(g)).count();
        let cap = self.host_capacity(&p);
        let share = p.containers.needs(1, None, None, cap, gpu_count);
        let worth = |gpus: u32, cpus: Option<u64>, mem: Option<u64>| crate::scheduler::gpu_worth(gpus, p.containers.needs(gpus, cpus, mem, cap, gpu_count), Some(share));
        self.reader().usage_worth_since(since, &worth)
    }

    /// The CPU and RAM a job is limited to and counted for (see [`crate::resources::Containers::needs`]).
    pub(super) fn job_needs(&self, p: &Policy, gpus: u32, cpus_milli: Option<u64>, memory: Option<u64>) -> CpuRam {
        let gpu_count = self.latest.read().unwrap().iter().filter(|g| self.usable(g)).count();
        p.containers.needs(gpus, cpus_milli, memory, self.host_capacity(p), gpu_count)
    }

    /// The CPUs to pin a job to when its share is whole CPUs (`Ok(None)`: it is not, the quota
    /// alone applies): that many CPUs no other job is pinned to (`elsewhere`: what Docker says
    /// Gantry's containers are pinned to, also other engines'), near its GPUs' NUMA node (a CPU-only
    /// job: away from the GPUs' nodes). Chosen under the running jobs' lock and recorded in the job's
    /// handle at once, so two launches never pick the same CPU. `Err`: not enough CPUs are free of
    /// other pins (the scheduler counts shares, not pins: other engines, or a lab config changed while
    /// jobs ran); the caller then keeps the quota and says so.
    pub(super) fn pin_cpus(&self, job_id: i64, cpus_milli: u64, gpus: &[u32], elsewhere: &[u32]) -> Result<Option<Vec<u32>>, String> {
        if cpus_milli == 0 || cpus_milli % 1000 != 0 {
            return Ok(None);
        }
        let n = (cpus_milli / 1000) as usize;
        let gpu_nodes: Vec<u32> = gpus.iter().filter_map(|g| self.gpu_numa.get(g).copied()).collect();
        let near = if gpus.is_empty() {
            let all_gpu_nodes: Vec<u32> = self.gpu_numa.values().copied().collect();
            let others: Vec<u32> = self.topology.nodes.iter().map(|n| n.0).filter(|n| !all_gpu_nodes.contains(n)).collect();
            self.topology.cpus_of(&others)
        } else {
            self.topology.cpus_of(&gpu_nodes)
        };
        let mut running = self.running.lock().unwrap();
        let mut taken: std::collections::BTreeSet<u32> = elsewhere.iter().copied().collect();
        taken.extend(running.iter().filter(|(id, _)| **id != job_id).flat_map(|(_, h)| h.cpuset.iter().copied()));
        match crate::resources::pick_cpus(n, &self.topology.cpus, &taken, &near) {
            Some(cpus) => {
                if let Some(h) = running.get_mut(&job_id) {
                    h.cpuset = cpus.clone();
                }
                Ok(Some(cpus))
            }
            None => {
                let free = self.topology.cpus.iter().filter(|c| !taken.contains(c)).count();
                let s = if n == 1 { "" } else { "s" };
                Err(format!("not pinned to CPUs: it asks for {n}, and {free} of the {} CPUs here are free of other jobs' pins; it gets a quota of {n} CPU{s} instead, on the CPUs it shares", self.topology.cpus.len()))
            }
        }
    }

    /// The owner's home folder (their passwd entry), where a job's HOME goes.
    pub(super) fn home_of(uid: u32) -> Option<String> {
        nix::unistd::User::from_uid(uid.into()).ok().flatten().map(|u| u.dir.to_string_lossy().into_owned())
    }
}
