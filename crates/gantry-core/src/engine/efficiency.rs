//! Measuring how each running attempt uses what it holds (issue 30 item 3), with no action from its
//! owner: after each GPU sample (1 Hz), its container's cgroup (CPU time, peak RAM; see
//! [`crate::cgroup`]) and its GPUs' utilization and its processes' GPU memory from that sample. The
//! figures are written every [`EFFICIENCY_SAVE_EVERY_MS`] and when the attempt ends; `gantry show`
//! reads them back ([`Engine::efficiency_of`]).
//!
//! The Slurm backend measures nothing here: its jobs run on other machines, whose cgroups this engine
//! cannot read, and without `slurmdbd` (`sacct`) Slurm keeps no CPU time or memory peak to ask for.

use std::collections::HashMap;
use std::path::Path;

use tracing::warn;

use super::Engine;
use crate::defaults::EFFICIENCY_SAVE_EVERY_MS;
use crate::efficiency::AttemptUse;
use crate::gpu::{BackendKind, GpuSample};
use crate::protocol::Efficiency;

/// A running job as measured: (job, its container, its GPUs, CPUs (thousandths) and RAM held).
type Running = (i64, Option<String>, Vec<u32>, u64, u64);

/// One running attempt's measures so far.
pub(crate) struct Measure {
    pub use_: AttemptUse,
    pub started_at: i64,
    /// When they were last written (ms); `None`: never.
    pub saved_at: Option<i64>,
}

impl Engine {
    /// After each GPU sample: update each running attempt's measures, write those due.
    pub(super) fn measure_efficiency(&self, samples: &[GpuSample], now: i64) {
        // What runs where: (job, its container, its GPUs, CPUs and RAM held).
        let running: Vec<Running> = self
            .running
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, h)| h.run.is_some())
            .map(|(id, h)| {
                (
                    *id,
                    h.run.as_ref().and_then(|r| r.container()).map(String::from),
                    h.gpus.clone(),
                    h.needs.cpus_milli,
                    h.needs.memory,
                )
            })
            .collect();
        // Jobs of this engine on each GPU.
        let mut on_gpu: HashMap<u32, usize> = HashMap::new();
        for (_, _, gpus, _, _) in &running {
            for g in gpus {
                *on_gpu.entry(*g).or_default() += 1;
            }
        }
        let simulated = self.backend_kind == BackendKind::Simulated;
        let mut due = vec![];
        // New attempts: their open attempt (and what an engine before a restart measured of it),
        // read before the measures' lock is taken (a reader of the store may wait for it).
        let missing: Vec<i64> = {
            let m = self.efficiency.lock().unwrap();
            running.iter().map(|r| r.0).filter(|id| !m.contains_key(id)).collect()
        };
        let mut fresh = vec![];
        if !missing.is_empty() {
            let st = self.reader();
            for id in missing {
                let Ok(Some(a)) = st.open_attempt(id) else { continue };
                let stored = st
                    .attempt_uses(id)
                    .ok()
                    .and_then(|u| u.into_iter().find(|u| u.attempt_id == a.id));
                fresh.push((
                    id,
                    Measure {
                        use_: stored.unwrap_or(AttemptUse {
                            attempt_id: a.id,
                            job_id: id,
                            ..Default::default()
                        }),
                        started_at: a.started_at,
                        saved_at: None,
                    },
                ));
            }
        }
        let mut m = self.efficiency.lock().unwrap();
        m.retain(|id, _| running.iter().any(|r| r.0 == *id));
        for (id, me) in fresh {
            m.entry(id).or_insert(me);
        }
        for (id, cid, gpus, cpus_milli, memory) in running {
            let Some(me) = m.get_mut(&id) else { continue };
            let u = &mut me.use_;
            u.cpus_milli = cpus_milli;
            u.ram_held = (memory > 0).then_some(memory);
            u.gpus = gpus.len() as u32;
            let wall = Some((now - me.started_at).max(0));
            match cid
                .as_deref()
                .and_then(|c| crate::cgroup::read_container(Path::new(crate::cgroup::ROOT), c))
            {
                Some(c) => {
                    if c.cpu_ns.is_some() {
                        u.cpu_ns = c.cpu_ns;
                    }
                    u.cpu_wall_ms = wall;
                    u.ram_peak = u.ram_peak.max(c.memory_peak);
                }
                // No cgroup to read here (a Slurm job, a fake executor): the time it was measured.
                None if u.cpu_ns.is_none() => u.cpu_wall_ms = wall,
                // Gone (it exited): its figures stay those of its last sample.
                None => {}
            }
            let mine: Vec<&GpuSample> = samples.iter().filter(|g| gpus.contains(&g.index)).collect();
            if !mine.is_empty() {
                let util = mine.iter().map(|g| g.utilization.min(100) as f64 / 100.0).sum::<f64>() / mine.len() as f64;
                u.gpu_util_sum += util;
                u.gpu_samples += 1;
                let shared = mine.iter().any(|g| {
                    on_gpu.get(&g.index).copied().unwrap_or(0) > 1
                        || g.processes
                            .iter()
                            .any(|p| p.container_id.is_none() || p.container_id != cid)
                });
                if shared {
                    u.gpu_shared += 1;
                }
                // The most its processes hold on one of its GPUs.
                let peak = mine
                    .iter()
                    .filter_map(|g| {
                        let held: Vec<u64> = g
                            .processes
                            .iter()
                            .filter(|p| cid.is_some() && p.container_id == cid)
                            .filter_map(|p| p.used_memory)
                            .collect();
                        (!held.is_empty()).then(|| held.iter().sum::<u64>())
                    })
                    .max();
                u.gpu_memory_peak = u.gpu_memory_peak.max(peak);
                u.gpu_memory_simulated = simulated;
                u.gpu_memory_total = mine.iter().map(|g| g.memory_total).max();
            }
            if me.saved_at.is_none_or(|s| now - s >= EFFICIENCY_SAVE_EVERY_MS) {
                me.saved_at = Some(now);
                due.push(me.use_.clone());
            }
        }
        drop(m);
        self.save_uses(&due);
    }

    fn save_uses(&self, uses: &[AttemptUse]) {
        if uses.is_empty() {
            return;
        }
        let st = self.store();
        for u in uses {
            // The learned GPU memory read back for the owner's next run comes from these rows: a
            // failed write is a failed state write (nothing new starts until one succeeds).
            if let Err(e) = st.save_attempt_use(u) {
                self.store_failed(&format!("saving the efficiency of job {}", u.job_id), &e);
                return;
            }
        }
    }

    /// Write an attempt's last measures (before its end is recorded).
    pub(super) fn save_efficiency(&self, job_id: i64, attempt_id: i64) {
        let u = self
            .efficiency
            .lock()
            .unwrap()
            .get(&job_id)
            .filter(|m| m.use_.attempt_id == attempt_id)
            .map(|m| m.use_.clone());
        if let Some(u) = u {
            self.save_uses(&[u]);
        }
    }

    /// A job's efficiency over its attempts: what was written (read through `st`, the caller's
    /// store), the running attempt's latest figures.
    pub(super) fn efficiency_of(&self, st: &crate::store::Store, job: &crate::store::Job) -> Option<Efficiency> {
        let mut uses = st.attempt_uses(job.id).ok()?;
        if let Some(m) = self.efficiency.lock().unwrap().get(&job.id) {
            match uses.iter_mut().find(|u| u.attempt_id == m.use_.attempt_id) {
                Some(u) => *u = m.use_.clone(),
                None => uses.push(m.use_.clone()),
            }
        }
        crate::efficiency::summarize(&uses, job.gpu_memory)
    }

    /// `gantry usage --efficiency` since `since` (ms), days in the viewer's time zone.
    pub fn usage_efficiency(
        &self,
        since: i64,
        tz_offset_min: i32,
    ) -> Result<crate::protocol::EfficiencyReport, super::EngineError> {
        let now = self.now();
        // Running attempts count with their last written figures (at most a few seconds old).
        let attempts = self.reader().usage_attempts(since, now)?;
        Ok(crate::efficiency::report(&attempts, since, now, tz_offset_min))
    }

    /// The GPU memory learned for job shapes before this start (`learned_gpu_memory`).
    pub(super) fn load_learned_gpu_memory(&self) {
        let rows = match self.reader().learned_gpu_memory() {
            Ok(r) => r,
            Err(e) => {
                warn!("could not read the learned GPU memory: {e}");
                return;
            }
        };
        let mut l = self.learned_gpu_memory.lock().unwrap();
        for (shape, bytes) in rows {
            if let Ok(key) = serde_json::from_str::<crate::estimate::JobKey>(&shape) {
                let e = l.entry(key).or_insert(0);
                *e = (*e).max(bytes);
            }
        }
    }

    /// Keep what a shape was stopped for using, for the next start of the engine.
    pub(super) fn save_learned_gpu_memory(&self, key: &crate::estimate::JobKey, bytes: u64) {
        let Ok(shape) = serde_json::to_string(key) else { return };
        if let Err(e) = self.store().save_learned_gpu_memory(&shape, bytes) {
            warn!(
                "could not save the learned GPU memory of {}'s {}: {e}",
                key.user, key.name
            );
        }
    }
}
