//! GPU sampling: the latest sample for the scheduler, an hour of 1 Hz samples for charts, and
//! per-minute aggregates in SQLite for history.

use std::collections::HashMap;
use std::sync::Arc;

use tracing::warn;

use super::Engine;
use crate::defaults::{LEAVING_MAX, OUTSIDE_IDLE_SHOWN_AFTER};
use crate::gpu::{GpuSample, SimLoad};
use crate::protocol::EngineEvent;

/// An hour of samples at 1 Hz.
const RECENT_SAMPLES: usize = 3600;

impl Engine {
    pub(super) async fn sampler_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.cfg.sample_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut idle = HashMap::new();
        // The minute being summed and, per GPU: (util sum, util max, mem sum, count).
        type MinuteSums = (i64, Vec<(u64, u32, u64, u64)>);
        let mut minute: Option<MinuteSums> = None;
        loop {
            tick.tick().await;
            let samples = self.sample_gpus();
            let now = self.now();
            let m = now - now.rem_euclid(60_000);
            if let Some((start, acc)) = &minute {
                if *start != m {
                    let mut st = self.store();
                    for (i, (us, umax, ms, n)) in acc.iter().enumerate() {
                        let (index, total) = samples
                            .get(i)
                            .map(|g| (g.index, g.memory_total))
                            .unwrap_or((i as u32, 0));
                        // Chart data, not job state: a lost minute is a gap in a chart, so warn only.
                        if let Err(e) =
                            st.record_gpu_minute(index, *start, *us as f64 / *n as f64, *umax, ms / n, total)
                        {
                            warn!("could not save GPU minute: {e}");
                        }
                    }
                    minute = None;
                }
            }
            let acc = &mut minute.get_or_insert_with(|| (m, vec![(0, 0, 0, 0); samples.len()])).1;
            for (a, g) in acc.iter_mut().zip(&samples) {
                a.0 += g.utilization as u64;
                a.1 = a.1.max(g.utilization);
                a.2 += g.memory_used;
                a.3 += 1;
            }
            self.watch_idle(&samples, &mut idle);
            self.measure_efficiency(&samples, now);
            let _ = self.events.send(EngineEvent::Gpus { at: now, gpus: samples });
        }
    }

    /// Read the GPUs once (the simulated backend first learns what Gantry runs).
    pub(super) fn sample_gpus(&self) -> Vec<GpuSample> {
        // This machine's GPUs (Docker), or the cluster's (Slurm: live where a node agent runs).
        let samples = match self.backend.sample(self) {
            Ok(s) => s,
            Err(e) => {
                warn!("GPU sampling failed: {e}");
                return self.latest.read().unwrap().clone();
            }
        };
        let now = self.now();
        {
            let mut r = self.recent.lock().unwrap();
            r.push_back((now, samples.iter().map(|g| (g.utilization, g.memory_used)).collect()));
            while r.len() > RECENT_SAMPLES {
                r.pop_front();
            }
        }
        track_idle(&mut self.idle_since.lock().unwrap(), &samples, now);
        *self.latest.write().unwrap() = samples.clone();
        // A container that ended is forgotten once a sample no longer lists it (or after LEAVING_MAX).
        self.leaving.lock().unwrap().retain(|cid, at| {
            now - *at < LEAVING_MAX.as_millis() as i64
                && samples.iter().any(|g| {
                    g.processes
                        .iter()
                        .any(|p| p.container_id.as_deref() == Some(cid.as_str()))
                })
        });
        self.enforce_gpu_memory(&samples, now);
        samples
    }

    /// Since when GPU `uuid` has sat at 0 %, once that is at least [`OUTSIDE_IDLE_SHOWN_AFTER`] ago
    /// (a short dip, e.g. a training loop loading data, is not idleness): the GPUs view's "idle for".
    pub(super) fn idle_since(&self, uuid: &str) -> Option<i64> {
        let since = *self.idle_since.lock().unwrap().get(uuid)?;
        (self.now() - since >= OUTSIDE_IDLE_SHOWN_AFTER.as_millis() as i64).then_some(since)
    }

    /// What Gantry runs on each GPU, for the simulated GPUs' figures.
    pub(super) fn sim_load(&self) -> Vec<SimLoad> {
        let mut load: HashMap<u32, SimLoad> = HashMap::new();
        for h in self.running.lock().unwrap().values() {
            for g in &h.gpus {
                let l = load.entry(*g).or_insert_with(|| SimLoad {
                    index: *g,
                    ..Default::default()
                });
                match h.gpu_memory {
                    None => l.exclusive = true,
                    Some(m) => {
                        l.shared_declared += m;
                        l.shared_jobs += 1;
                    }
                }
                // Once it has a container, the job's memory shows as that container's process.
                if let Some(cid) = h.run.as_ref().and_then(|r| r.container()) {
                    l.containers.push((cid.to_string(), h.gpu_memory));
                }
            }
        }
        let mut load: Vec<SimLoad> = load.into_values().collect();
        for l in &mut load {
            l.containers.sort();
        }
        load
    }

    /// Last hour of 1 Hz samples.
    pub fn recent_samples(&self, since_ms: i64) -> Vec<(i64, Vec<(u32, u64)>)> {
        self.recent
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _)| *t >= since_ms)
            .cloned()
            .collect()
    }
}

/// One sample's update of "idle since" per GPU (by UUID): a GPU at 0 % keeps the time of the first
/// such sample in a row, a busy one has none, a GPU no longer reported is forgotten.
pub(super) fn track_idle(since: &mut HashMap<String, i64>, samples: &[GpuSample], now: i64) {
    since.retain(|uuid, _| samples.iter().any(|g| g.uuid == *uuid && g.utilization == 0));
    for g in samples.iter().filter(|g| g.utilization == 0) {
        since.entry(g.uuid.clone()).or_insert(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(util: &[(&str, u32)]) -> Vec<GpuSample> {
        util.iter()
            .enumerate()
            .map(|(i, (uuid, u))| GpuSample {
                index: i as u32,
                uuid: uuid.to_string(),
                name: "GPU".into(),
                memory_total: 0,
                memory_used: 0,
                utilization: *u,
                temperature_c: None,
                power_w: None,
                processes: vec![],
                mig_parent: None,
                links: vec![],
            })
            .collect()
    }

    #[test]
    fn a_gpu_is_idle_since_its_first_zero_sample_in_a_row() {
        // (ms, samples, idle since wanted per uuid)
        #[allow(clippy::type_complexity)] // a table test: one tuple per case reads as the table
        let rows: Vec<(i64, Vec<(&str, u32)>, Vec<(&str, i64)>)> = vec![
            (0, vec![("a", 0), ("b", 40)], vec![("a", 0)]),
            (1000, vec![("a", 0), ("b", 0)], vec![("a", 0), ("b", 1000)]),
            (2000, vec![("a", 3), ("b", 0)], vec![("b", 1000)]),
            (3000, vec![("a", 0), ("b", 0)], vec![("a", 3000), ("b", 1000)]),
            // GPU b is no longer reported (a MIG layout changed, the driver lost it): forgotten.
            (4000, vec![("a", 0)], vec![("a", 3000)]),
            (5000, vec![("a", 0), ("b", 0)], vec![("a", 3000), ("b", 5000)]),
        ];
        let mut since = HashMap::new();
        for (now, util, want) in rows {
            track_idle(&mut since, &at(&util), now);
            let mut got: Vec<(&str, i64)> = since.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            got.sort();
            assert_eq!(got, want, "at {now} ms");
        }
    }
}
