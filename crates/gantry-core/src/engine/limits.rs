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
        let worth = |gpus: u32, cpus: Option<u64>, mem: Option<u64>| {
            crate::scheduler::gpu_worth(gpus, p.containers.needs(gpus, cpus, mem, cap, gpu_count), Some(share))
        };
        self.reader().usage_worth_since(since, &worth)
    }

    /// The CPU and RAM a job is limited to and counted for (see
    /// [`crate::resources::Containers::needs_sharing`]): a job sharing GPUs (`gpu_memory`) gets its part.
    pub(super) fn job_needs(
        &self,
        p: &Policy,
        gpus: u32,
        cpus_milli: Option<u64>,
        memory: Option<u64>,
        gpu_memory: Option<u64>,
    ) -> CpuRam {
        let gpu_count = self.latest.read().unwrap().iter().filter(|g| self.usable(g)).count();
        p.containers.needs_sharing(
            gpus,
            cpus_milli,
            memory,
            self.host_capacity(p),
            gpu_count,
            self.sharing_part(gpu_memory),
        )
    }

    /// A GPU-sharing job's part of a GPU: its declared `gpu_memory` of the largest usable GPU's memory
    /// (so the jobs packed on any one GPU hold at most its CPU/RAM share together).
    pub(super) fn sharing_part(&self, gpu_memory: Option<u64>) -> Option<(u64, u64)> {
        let m = gpu_memory?;
        let largest = self
            .latest
            .read()
            .unwrap()
            .iter()
            .filter(|g| self.usable(g))
            .map(|g| g.memory_total)
            .max()?;
        Some((m, largest))
    }

    /// The CPUs to pin a job to when its share is whole CPUs (`Ok(None)`: it is not, the quota
    /// alone applies): that many CPUs no other job is pinned to (`elsewhere`: what Docker says
    /// Gantry's containers are pinned to, also other engines'), near its GPUs' NUMA node (a CPU-only
    /// job: away from the GPUs' nodes). Chosen under the running jobs' lock and recorded in the job's
    /// handle at once, so two launches never pick the same CPU. `Err`: not enough CPUs are free of
    /// other pins (the scheduler counts shares, not pins: other engines, or a lab config changed while
    /// jobs ran); the caller then keeps the quota and says so.
    pub(super) fn pin_cpus(
        &self,
        job_id: i64,
        cpus_milli: u64,
        gpus: &[u32],
        elsewhere: &[u32],
    ) -> Result<Option<Vec<u32>>, String> {
        if cpus_milli == 0 || !cpus_milli.is_multiple_of(1000) {
            return Ok(None);
        }
        let n = (cpus_milli / 1000) as usize;
        let gpu_nodes: Vec<u32> = gpus.iter().filter_map(|g| self.gpu_numa.get(g).copied()).collect();
        let near = if gpus.is_empty() {
            let all_gpu_nodes: Vec<u32> = self.gpu_numa.values().copied().collect();
            let others: Vec<u32> = self
                .topology
                .nodes
                .iter()
                .map(|n| n.0)
                .filter(|n| !all_gpu_nodes.contains(n))
                .collect();
            self.topology.cpus_of(&others)
        } else {
            self.topology.cpus_of(&gpu_nodes)
        };
        let mut running = self.running.lock().unwrap();
        let mut taken: std::collections::BTreeSet<u32> = elsewhere.iter().copied().collect();
        taken.extend(
            running
                .iter()
                .filter(|(id, _)| **id != job_id)
                .flat_map(|(_, h)| h.cpuset.iter().copied()),
        );
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
        nix::unistd::User::from_uid(uid.into())
            .ok()
            .flatten()
            .map(|u| u.dir.to_string_lossy().into_owned())
    }
}

/// What the 1 Hz GPU sample says about a shared job's GPU memory (issue 18 item 15).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum MemoryVerdict {
    /// Within its declaration (and the margin), as before.
    Fine,
    /// Over it for the first time: warn in its log; stopped after the grace unless it goes back.
    Warn(String),
    /// Still over, within the grace.
    StillOver,
    /// Over for the whole grace: stop it, with this reason.
    Stop(String),
    /// Back within it after a warning.
    Back(String),
}

/// Pure: `used` is the most it holds on one of its GPUs (`gpu`, bytes), `over_since` when it was
/// first seen over (ms).
pub(crate) fn memory_verdict(
    declared: u64,
    used: (u32, u64),
    over_since: Option<i64>,
    now: i64,
    margin_pct: f64,
    grace: std::time::Duration,
    set_in: &str,
) -> MemoryVerdict {
    use crate::units::{duration_setting, format_bytes};
    let (gpu, used) = used;
    let limit = declared.saturating_add((declared as f64 * margin_pct / 100.0) as u64);
    match (used > limit, over_since) {
        (false, None) => MemoryVerdict::Fine,
        (false, Some(_)) => MemoryVerdict::Back(format!("back within its declared GPU memory ({} of GPU {gpu}): it keeps running", format_bytes(used))),
        (true, None) => MemoryVerdict::Warn(format!(
            "WARNING: uses {} of GPU {gpu}, more than its declared gpu_memory of {} and the lab's {margin_pct}% margin{set_in}; the jobs sharing this GPU rely on the declaration: it is stopped in {} unless it goes back under {}",
            format_bytes(used),
            format_bytes(declared),
            duration_setting(grace),
            format_bytes(limit)
        )),
        (true, Some(since)) if now - since >= grace.as_millis() as i64 => MemoryVerdict::Stop(format!(
            "stopped: used {} of GPU {gpu} for {}, more than its declared gpu_memory of {} and the lab's {margin_pct}% margin{set_in}; declare what it needs (`gpu_memory: {}`), or leave `gpu_memory` out to get a whole GPU",
            format_bytes(used),
            duration_setting(grace),
            format_bytes(declared),
            format_bytes(used.next_multiple_of(1 << 30)).replace(".0 ", "").replace(' ', "")
        )),
        (true, Some(_)) => MemoryVerdict::StillOver,
    }
}

impl Engine {
    /// The GPU memory a job is placed and held to: its declaration, or what its shape was stopped
    /// for using if that is more (the measure is trusted, not the declaration, next time).
    pub(super) fn gpu_memory_of(&self, key: &crate::estimate::JobKey, declared: Option<u64>) -> Option<u64> {
        let d = declared?;
        Some(
            self.learned_gpu_memory
                .lock()
                .unwrap()
                .get(key)
                .map_or(d, |l| d.max(*l)),
        )
    }

    /// After each GPU sample: a job on a shared GPU (`gpu_memory` declared) using more than it
    /// declared by the lab's margin is warned in its log, and stopped after the grace with the reason
    /// (its end in history says why). Only where NVML reports each of its processes' memory.
    pub(super) fn enforce_gpu_memory(&self, samples: &[crate::gpu::GpuSample], now: i64) {
        let p = self.policy();
        let set_in = self.set_in("jobs.gpu_memory_margin");
        let mut logs = vec![];
        let mut learned = vec![];
        {
            let mut running = self.running.lock().unwrap();
            for (id, h) in running.iter_mut() {
                let (Some(declared), Some(cid)) = (
                    h.gpu_memory,
                    h.run.as_ref().and_then(|r| r.container()).map(String::from),
                ) else {
                    continue;
                };
                if h.over_memory.as_ref().is_some_and(|o| o.1.is_some()) {
                    continue; // being stopped
                }
                // The most it holds on one of its GPUs; unknown when one of its processes does not say.
                let mut worst: Option<(u32, u64)> = None;
                let mut known = true;
                for g in samples.iter().filter(|g| h.gpus.contains(&g.index)) {
                    let mine: Vec<_> = g
                        .processes
                        .iter()
                        .filter(|p| p.container_id.as_deref() == Some(cid.as_str()))
                        .collect();
                    match mine.iter().map(|p| p.used_memory).sum::<Option<u64>>() {
                        Some(u) if worst.is_none_or(|w| u > w.1) => worst = Some((g.index, u)),
                        Some(_) => {}
                        None => known = false,
                    }
                }
                let Some(used) = worst.filter(|_| known) else { continue };
                match memory_verdict(
                    declared,
                    used,
                    h.over_memory.as_ref().map(|o| o.0),
                    now,
                    p.gpu_memory_margin_pct,
                    p.gpu_memory_grace,
                    &set_in,
                ) {
                    MemoryVerdict::Fine | MemoryVerdict::StillOver => {}
                    MemoryVerdict::Warn(m) => {
                        h.over_memory = Some((now, None));
                        logs.push((*id, m));
                    }
                    MemoryVerdict::Back(m) => {
                        h.over_memory = None;
                        logs.push((*id, m));
                    }
                    MemoryVerdict::Stop(why) => {
                        h.over_memory = Some((h.over_memory.as_ref().map_or(now, |o| o.0), Some(why.clone())));
                        h.cancel.cancel();
                        logs.push((*id, why));
                        learned.push((h.key.clone(), used.1));
                    }
                }
            }
        }
        for (id, m) in logs {
            tracing::warn!(job = id, "{m}");
            super::append_log(&self.log_of(id), &m);
        }
        // The next job of that user's shape is placed (and held) at what this one used.
        for (key, used) in learned {
            {
                let mut l = self.learned_gpu_memory.lock().unwrap();
                let e = l.entry(key.clone()).or_insert(0);
                *e = (*e).max(used);
            }
            // Kept across restarts (issue 30 item 3).
            self.save_learned_gpu_memory(&key, used);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_job_over_its_declared_gpu_memory_is_warned_then_stopped_after_the_grace() {
        let g = 1u64 << 30;
        let grace = Duration::from_secs(30);
        let v = |used: u64, since: Option<i64>, now: i64| memory_verdict(4 * g, (0, used), since, now, 20.0, grace, "");
        assert_eq!(v(4 * g, None, 0), MemoryVerdict::Fine);
        assert_eq!(v(4 * g + g / 2, None, 0), MemoryVerdict::Fine, "within the 20% margin");
        assert!(
            matches!(v(10 * g, None, 0), MemoryVerdict::Warn(m) if m == "WARNING: uses 10.0 GiB of GPU 0, more than its declared gpu_memory of 4.0 GiB and the lab's 20% margin; the jobs sharing this GPU rely on the declaration: it is stopped in 30s unless it goes back under 4.8 GiB")
        );
        assert_eq!(v(10 * g, Some(0), 29_999), MemoryVerdict::StillOver);
        assert!(
            matches!(v(10 * g, Some(0), 30_000), MemoryVerdict::Stop(m) if m.starts_with("stopped: used 10.0 GiB of GPU 0 for 30s, more than its declared gpu_memory of 4.0 GiB") && m.contains("`gpu_memory: 10GiB`"))
        );
        assert!(matches!(v(3 * g, Some(0), 10_000), MemoryVerdict::Back(_)));
        assert!(
            matches!(
                memory_verdict(4 * g, (0, 4 * g + 1), None, 0, 0.0, grace, ""),
                MemoryVerdict::Warn(_)
            ),
            "a 0% margin warns at once"
        );
    }
}
