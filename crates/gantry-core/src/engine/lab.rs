//! The lab policy at work: reload on SIGHUP, retention, and the usage report.

use std::sync::Arc;
use std::time::Duration;

use tracing::{error, info, warn};

use super::{Engine, EngineError};
use crate::config::FAIR_SHARE_REACH;
use crate::policy::{LabConfig, Policy, PolicyError};
use crate::store::UsageReport;

impl Engine {
    /// The policy in force now.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Re-read the lab config. On a problem, the policy in force stays and the problem is logged
    /// (with line and column); on success, the new policy applies at once and what changed is logged.
    /// Settings that cannot change live (GPUs, drop folders) are named with "restart to apply".
    pub fn reload_policy(&self) -> Result<(), PolicyError> {
        let Some(file) = &self.cfg.lab_file else {
            info!("reload asked, but this engine reads no lab config (start it with --config FILE to use one)");
            return Ok(());
        };
        let loaded = LabConfig::load(file, self.cfg.lab_file_optional).and_then(|lab| {
            if let Some(g) = &lab.gpus {
                let inventory: Vec<(u32, String)> = self
                    .latest
                    .read()
                    .unwrap()
                    .iter()
                    .map(|g| (g.index, g.uuid.clone()))
                    .collect();
                g.resolve(&inventory)?;
            }
            Ok(lab)
        });
        let lab = match loaded {
            Ok(lab) => lab,
            Err(e) => {
                error!("lab config not reloaded, the policy in force stays: {e}");
                return Err(e);
            }
        };
        for key in lab.restart_only_changes(&self.cfg.lab) {
            warn!("{}: `{key}` changed; restart the engine to apply it", file.display());
        }
        let new = Arc::new(self.cfg.overrides.apply(lab.policy));
        let changes = new.changes_from(&self.policy());
        if changes.is_empty() {
            info!("reloaded {}: no policy change", file.display());
        } else {
            info!("reloaded {}: {}", file.display(), changes.join("; "));
        }
        *self.policy.write().unwrap_or_else(|p| p.into_inner()) = new;
        self.stats.lock().unwrap().at = 0; // a new half-life counts from the next pass
        self.wake.notify_one();
        Ok(())
    }

    /// Retention at start, then every [`crate::config::PRUNE_EVERY`].
    pub(super) async fn prune_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(crate::config::PRUNE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let e = self.clone();
            match tokio::task::spawn_blocking(move || {
                let now = e.now();
                e.prune(now)
            })
            .await
            {
                // A delete that cannot be written is a database that cannot be written: the same
                // stop-starting-work as any other failed write (the next pass's probe lifts it).
                Ok(Err(EngineError::Store(err))) => self.store_failed("retention", &err),
                Ok(Err(err)) => warn!("retention: {err}"),
                Err(err) => warn!("retention crashed: {err}"),
                Ok(Ok(_)) => {}
            }
        }
    }

    /// Delete finished jobs older than `history.keep` and log files older than `logs.keep`.
    /// Never touches a queued, held, starting or running job. Returns (jobs, log files) deleted.
    pub fn prune(&self, now: i64) -> Result<(usize, usize), EngineError> {
        let p = self.policy();
        let ms = |d: Duration| d.as_millis().min(i64::MAX as u128) as i64;
        let (mut jobs, mut logs) = (0, 0);
        if let Some(keep) = p.history_keep {
            let ids = self.reader().ended_before(now.saturating_sub(ms(keep)))?;
            for chunk in ids.chunks(500) {
                let gone = self.store().delete_ended(chunk)?;
                logs += gone
                    .iter()
                    .filter(|id| std::fs::remove_file(self.log_of(**id)).is_ok())
                    .count();
                jobs += gone.len();
                if let (Some(a), Some(b)) = (gone.first(), gone.last()) {
                    info!(
                        "retention: deleted {} finished jobs ({a}..{b}) that ended more than {} ago (history.keep)",
                        gone.len(),
                        crate::units::duration_setting(keep)
                    );
                }
            }
        }
        if let Some(keep) = p.log_keep {
            let ids = self.reader().ended_before(now.saturating_sub(ms(keep)))?;
            let n = ids
                .iter()
                .filter(|id| std::fs::remove_file(self.log_of(**id)).is_ok())
                .count();
            if n > 0 {
                info!(
                    "retention: deleted the log files of {n} jobs that ended more than {} ago (logs.keep)",
                    crate::units::duration_setting(keep)
                );
            }
            logs += n;
        }
        // Results folders of jobs that ended while the engine was away, or were deleted just now.
        self.sweep_results_dirs();
        Ok((jobs, logs))
    }

    /// Per user since `since` (ms): GPU-hours, jobs finished, mean wait, and fair-share usage.
    pub fn usage(&self, since: i64) -> Result<UsageReport, EngineError> {
        let now = self.now();
        let hl = self.policy().fair_share_half_life.as_millis() as i64;
        let st = self.reader();
        // Attempts for the decayed figure reach back 5 half-lives, like the scheduler's.
        let reach = now - FAIR_SHARE_REACH * hl;
        let attempts = st.usage_since(since.min(reach))?;
        let in_window: Vec<_> = attempts
            .iter()
            .filter(|a| a.3.is_none_or(|e| e >= since))
            .cloned()
            .collect();
        let mut r = crate::store::usage_report(
            since,
            now,
            hl,
            &in_window,
            &st.finished_since(since)?,
            &st.waits_since(since)?,
        );
        let preempted: std::collections::HashMap<String, f64> = st.preempted_since(since)?.into_iter().collect();
        drop(st);
        // Fair share counts what the scheduler counts (CPU/RAM in per-GPU shares too), also before the window.
        let decayed = crate::store::decayed_worth(&self.usage_worth(reach)?, now, hl);
        for u in &mut r.users {
            u.fair_share_usage = decayed.get(&u.user).copied().unwrap_or(0.0);
            u.gpu_hours_preempted = preempted.get(&u.user).copied().unwrap_or(0.0);
        }
        for (user, v) in decayed {
            if !r.users.iter().any(|u| u.user == user) {
                r.users.push(crate::store::UserUsage {
                    user,
                    gpu_hours: 0.0,
                    jobs_finished: 0,
                    mean_wait_ms: None,
                    fair_share_usage: v,
                    gpu_hours_preempted: 0.0,
                });
            }
        }
        Ok(r)
    }

    /// The Usage view's charts since `since`: GPU-hours per user per bucket, and utilization by
    /// local day and hour (`tz_offset_min` east of UTC).
    pub fn usage_charts(
        &self,
        since: i64,
        bucket_ms: i64,
        tz_offset_min: i32,
    ) -> Result<crate::protocol::UsageCharts, EngineError> {
        let now = self.now();
        let tz = tz_offset_min as i64 * 60_000;
        let st = self.reader();
        let buckets = crate::store::usage_buckets(&st.usage_since(since)?, since, now, bucket_ms, tz);
        let heat = st.util_by_hour(since, tz)?;
        Ok(crate::protocol::UsageCharts {
            since_ms: since,
            until_ms: now,
            bucket_ms,
            buckets,
            heat,
        })
    }
}
