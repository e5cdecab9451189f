//! Usage statistics: fair-share usage, typical waits and runtimes, submission shapes, per-minute GPU figures.

use rusqlite::params;

use super::*;
pub use crate::protocol::{UsageReport, UserUsage};
use crate::spec::ValidJob;

impl Store {
    /// GPU use per owner since `since` (ms): (owner, GPUs, start, end or None while running).
    pub fn usage_since(&self, since: i64) -> Result<Vec<UsageRow>> {
        let mut st = self.conn.prepare_cached(
            "SELECT j.owner, json_array_length(a.gpus), a.started_at, a.ended_at FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.ended_at IS NULL OR a.ended_at >= ?1",
        )?;
        let rows = st
            .query_map([since], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Like [`Store::usage_since`], each attempt weighed by `worth(gpus, spec cpus, spec memory)`: its
    /// GPUs, or its CPU/RAM in per-GPU shares when that is more (what fair share counts).
    pub fn usage_worth_since(
        &self,
        since: i64,
        worth: &dyn Fn(u32, Option<u64>, Option<u64>) -> f64,
    ) -> Result<Vec<WorthRow>> {
        let mut st = self.conn.prepare_cached(
            "SELECT j.owner, json_array_length(a.gpus), a.started_at, a.ended_at, json_extract(j.spec_json, '$.limits.cpus_milli'), json_extract(j.spec_json, '$.limits.memory') \
             FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.ended_at IS NULL OR a.ended_at >= ?1",
        )?;
        let rows = st
            .query_map([since], |r| {
                let (gpus, cpus, mem): (u32, Option<i64>, Option<i64>) = (r.get(1)?, r.get(4)?, r.get(5)?);
                Ok((
                    r.get(0)?,
                    worth(gpus, cpus.map(|c| c.max(0) as u64), mem.map(|m| m.max(0) as u64)),
                    r.get(2)?,
                    r.get(3)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// GPU-hours of attempts that ended by preemption since `since` (ms), per owner.
    pub fn preempted_since(&self, since: i64) -> Result<Vec<(String, f64)>> {
        let mut st = self.conn.prepare_cached(
            "SELECT j.owner, SUM((a.ended_at - MAX(a.started_at, ?1)) * json_array_length(a.gpus)) / 3600000.0 FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.reason = 'preempted' AND a.ended_at >= ?1 GROUP BY j.owner",
        )?;
        let rows = st
            .query_map([since], |r| Ok((r.get(0)?, r.get::<_, Option<f64>>(1)?.unwrap_or(0.0))))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Finished jobs per owner since `since` (ms), as `gantry history --since` counts them.
    pub fn finished_since(&self, since: i64) -> Result<Vec<(String, u64)>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT owner, COUNT(*) FROM jobs WHERE finished_at >= ?1 GROUP BY owner")?;
        let rows = st
            .query_map([since], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// (owner, ms from submit to first start) of jobs first started since `since`.
    pub fn waits_since(&self, since: i64) -> Result<Vec<(String, i64)>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT owner, started_at - submitted_at FROM jobs WHERE started_at >= ?1")?;
        let rows = st
            .query_map([since], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Per owner, how many attempts that ended since `since` ran past their job's declared runtime
    /// by more than the margin (`margin_ms`, or a tenth of the declaration when longer; see
    /// `scheduler::overran_ms`): what `estimate::trusted_runtime` weighs a declaration by.
    pub fn overruns_since(&self, since: i64, margin_ms: i64) -> Result<std::collections::HashMap<String, u32>> {
        let mut st = self.conn.prepare_cached(
            "SELECT j.owner, COUNT(*) FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE j.expected_runtime_ms IS NOT NULL AND a.ended_at IS NOT NULL AND a.ended_at >= ?1 \
             AND a.ended_at - a.started_at - j.expected_runtime_ms > MAX(?2, j.expected_runtime_ms / ?3) GROUP BY j.owner",
        )?;
        let rows = st.query_map(params![since, margin_ms, crate::defaults::OVERRUN_FRACTION_DIV], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u32))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Mean wait (ms) of first attempts started since `since`.
    pub fn typical_wait(&self, since: i64) -> Result<Option<i64>> {
        let v: Option<f64> = self
            .conn
            .prepare_cached("SELECT AVG(a.started_at - j.submitted_at) FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.n = 1 AND a.started_at >= ?1")?
            .query_row([since], |r| r.get(0))?;
        Ok(v.map(|v| v as i64))
    }

    /// The last `limit` successful runs as (what was known before they ran, wall time in ms): the
    /// runtime estimator's input (see `estimate::History`).
    /// The request shapes (GPUs, memory per GPU) of the last `limit` jobs submitted: FGD packing's mix.
    pub fn recent_shapes(&self, limit: usize) -> Result<Vec<(u32, Option<u64>)>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT gpus, gpu_memory FROM jobs ORDER BY id DESC LIMIT ?1")?;
        let rows = st.query_map([limit as i64], |r| {
            Ok((r.get::<_, u32>(0)?, r.get::<_, Option<i64>>(1)?.map(|m| m as u64)))
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    pub fn recent_runtimes(&self, limit: usize) -> Result<Vec<(crate::estimate::JobKey, i64)>> {
        let mut st = self.conn.prepare_cached(
            "SELECT owner, name, image, gpus, gpu_memory, json_extract(spec_json, '$.limits.cpus_milli'), json_extract(spec_json, '$.limits.memory'), \
             finished_at - started_at FROM jobs WHERE state = 'succeeded' AND started_at IS NOT NULL AND finished_at IS NOT NULL ORDER BY id DESC LIMIT ?1",
        )?;
        let mut v = st
            .query_map([limit as i64], |r| {
                Ok((
                    crate::estimate::JobKey {
                        user: r.get(0)?,
                        name: r.get(1)?,
                        image: r.get(2)?,
                        gpus: r.get(3)?,
                        gpu_memory: r.get::<_, Option<i64>>(4)?.map(|v| v as u64),
                        cpus_milli: r.get::<_, Option<i64>>(5)?.unwrap_or(0) as u64,
                        memory: r.get::<_, Option<i64>>(6)?.unwrap_or(0) as u64,
                    },
                    r.get(7)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        v.reverse(); // oldest first, as they completed
        Ok(v)
    }

    /// Median duration (ms) of the last 20 successful runs with this name and image.
    pub fn typical_runtime(&self, name: &str, image: &str) -> Result<Option<i64>> {
        let mut st = self.conn.prepare_cached(
            "SELECT finished_at - started_at FROM jobs WHERE name = ?1 AND image = ?2 AND state = 'succeeded' ORDER BY id DESC LIMIT 20",
        )?;
        let mut v: Vec<i64> = st
            .query_map(params![name, image], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        v.sort();
        Ok(v.get(v.len() / 2).copied())
    }

    /// Fill the store with `n` completed runs from 8 users, 20 job names and 5 images (every 7th
    /// failed), for benchmarks of history queries and the app. Returns the users' names.
    pub fn seed_completed_runs(&mut self, n: usize) -> Result<Vec<&'static str>> {
        use crate::spec::{validate_text, Format, Origin};
        let users = vec!["ada", "bob", "cy", "dee", "eve", "fay", "gus", "hal"];
        let jobs: Vec<ValidJob> = (0..20)
            .map(|i| {
                validate_text(
                    &format!("name: exp-{i}\nimage: img{}:1\ngpus: {}\n", i % 5, 1 + i % 4),
                    Format::Yaml,
                    &Origin::default(),
                )
                .expect("valid seed spec")
            })
            .collect();
        self.bulk(|st| -> Result<()> {
            for i in 0..n {
                let o = Owner {
                    uid: 1000 + (i % users.len()) as u32,
                    gid: 1000,
                    name: users[i % users.len()].into(),
                };
                let id = st.insert_job(&jobs[i % jobs.len()], &o, "seed", None, |_, _| None)?;
                let Some(a) = st.begin_attempt(id, &[(i % 8) as u32], &[])? else {
                    continue;
                };
                let next = if i % 7 == 0 {
                    JobState::Failed
                } else {
                    JobState::Succeeded
                };
                st.end_attempt(
                    id,
                    a.id,
                    &Ending {
                        exit_code: Some((i % 7 == 0) as i64),
                        reason: EndReason::Exited,
                        message: None,
                        next,
                        not_before: None,
                    },
                )?;
            }
            Ok(())
        })??;
        Ok(users)
    }

    /// Record one minute of GPU aggregates (replacing a partial one for the same minute).
    pub fn record_gpu_minute(
        &mut self,
        gpu: u32,
        minute_ms: i64,
        util_avg: f64,
        util_max: u32,
        mem_used_avg: u64,
        mem_total: u64,
    ) -> Result<()> {
        self.conn
            .prepare_cached("INSERT OR REPLACE INTO gpu_minutes VALUES (?1, ?2, ?3, ?4, ?5, ?6)")?
            .execute(params![
                gpu,
                minute_ms,
                util_avg,
                util_max,
                mem_used_avg as i64,
                mem_total as i64
            ])?;
        Ok(())
    }

    /// Per-minute aggregates for one GPU since `since_ms`: (minute, util_avg, mem_used_avg).
    pub fn gpu_minutes(&self, gpu: u32, since_ms: i64) -> Result<Vec<(i64, f64, i64)>> {
        let mut st = self.conn.prepare_cached("SELECT minute, util_avg, mem_used_avg FROM gpu_minutes WHERE gpu_index = ?1 AND minute >= ?2 ORDER BY minute")?;
        let rows = st
            .query_map(params![gpu, since_ms], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Mean utilization of all GPUs per local (day, hour) since `since` (`tz_ms`: the offset east of UTC).
    pub fn util_by_hour(&self, since: i64, tz_ms: i64) -> Result<Vec<crate::protocol::UtilCell>> {
        let mut st = self.conn.prepare_cached(
            "SELECT ((minute + ?2) / 86400000) * 86400000 - ?2 AS day, ((minute + ?2) / 3600000) % 24 AS hour, AVG(util_avg) \
             FROM gpu_minutes WHERE minute >= ?1 GROUP BY day, hour ORDER BY day, hour",
        )?;
        let rows = st
            .query_map(params![since, tz_ms], |r| {
                Ok(crate::protocol::UtilCell {
                    day: r.get(0)?,
                    hour: r.get::<_, i64>(1)? as u32,
                    utilization: r.get(2)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }
}

/// GPU-hours per (bucket, user) of `rows` over [since, until), buckets `bucket_ms` wide aligned to
/// local time (`tz_ms` east of UTC); a running attempt counts up to `until`. Pure.
pub fn usage_buckets(
    rows: &UsageRows,
    since: i64,
    until: i64,
    bucket_ms: i64,
    tz_ms: i64,
) -> Vec<crate::protocol::UsageBucket> {
    let bucket_ms = bucket_ms.max(60_000);
    let align = |t: i64| (t + tz_ms).div_euclid(bucket_ms) * bucket_ms - tz_ms;
    let mut out: std::collections::BTreeMap<(i64, String), f64> = Default::default();
    for (user, gpus, start, end) in rows {
        let (a, b) = ((*start).max(since), end.unwrap_or(until).min(until));
        if b <= a || *gpus == 0 {
            continue;
        }
        let mut t = align(a);
        while t < b {
            let (lo, hi) = (t.max(a), (t + bucket_ms).min(b));
            if hi > lo {
                *out.entry((t, user.clone())).or_default() += (hi - lo) as f64 * *gpus as f64 / 3_600_000.0;
            }
            t += bucket_ms;
        }
    }
    out.into_iter()
        .map(|((start, user), gpu_hours)| crate::protocol::UsageBucket { start, user, gpu_hours })
        .collect()
}

/// An attempt as [`Store::usage_since`] returns it: (owner, GPUs, start, end or `None` while running).
pub type UsageRow = (String, u32, i64, Option<i64>);
pub type UsageRows = [UsageRow];

/// Fair share: each attempt's GPU-hours, halved for every `half_life_ms` since it ended.
/// An attempt weighed for fair share: (owner, GPUs' worth, started, ended).
pub type WorthRow = (String, f64, i64, Option<i64>);

/// [`decayed_usage`] of weighed attempts ([`Store::usage_worth_since`]).
pub fn decayed_worth(rows: &[WorthRow], now: i64, half_life_ms: i64) -> std::collections::HashMap<String, f64> {
    let hl = half_life_ms.max(1) as f64;
    let mut usage = std::collections::HashMap::new();
    for (owner, worth, start, end) in rows {
        let end = end.unwrap_or(now);
        let hours = (end - start).max(0) as f64 / 3_600_000.0 * worth;
        *usage.entry(owner.clone()).or_default() += hours * 0.5f64.powf((now - end) as f64 / hl);
    }
    usage
}

pub fn decayed_usage(rows: &UsageRows, now: i64, half_life_ms: i64) -> std::collections::HashMap<String, f64> {
    let hl = half_life_ms.max(1) as f64;
    let mut usage = std::collections::HashMap::new();
    for (owner, gpus, start, end) in rows {
        let end = end.unwrap_or(now);
        let hours = (end - start).max(0) as f64 / 3_600_000.0 * *gpus as f64;
        *usage.entry(owner.clone()).or_default() += hours * 0.5f64.powf((now - end) as f64 / hl);
    }
    usage
}

/// The usage report from the store's rows: GPU-hours clipped to the window, jobs finished, mean wait
/// and the decayed usage fair share acts on. Users sorted by GPU-hours, most first.
pub fn usage_report(
    since: i64,
    now: i64,
    half_life_ms: i64,
    attempts: &UsageRows,
    finished: &[(String, u64)],
    waits: &[(String, i64)],
) -> UsageReport {
    let mut users: std::collections::BTreeMap<String, UserUsage> = std::collections::BTreeMap::new();
    fn entry<'a>(users: &'a mut std::collections::BTreeMap<String, UserUsage>, u: &str) -> &'a mut UserUsage {
        users.entry(u.to_string()).or_insert_with(|| UserUsage {
            user: u.to_string(),
            gpu_hours: 0.0,
            jobs_finished: 0,
            mean_wait_ms: None,
            fair_share_usage: 0.0,
            gpu_hours_preempted: 0.0,
        })
    }
    for (owner, gpus, start, end) in attempts {
        let (a, b) = ((*start).max(since), end.unwrap_or(now).min(now));
        if b > a {
            entry(&mut users, owner).gpu_hours += (b - a) as f64 / 3_600_000.0 * *gpus as f64;
        } else {
            entry(&mut users, owner);
        }
    }
    for (owner, n) in finished {
        entry(&mut users, owner).jobs_finished += n;
    }
    let mut wait_sums: std::collections::BTreeMap<&str, (i64, i64)> = std::collections::BTreeMap::new();
    for (owner, w) in waits {
        let s = wait_sums.entry(owner).or_default();
        s.0 += w;
        s.1 += 1;
    }
    for (owner, (sum, n)) in wait_sums {
        entry(&mut users, owner).mean_wait_ms = Some(sum / n);
    }
    for (owner, u) in decayed_usage(attempts, now, half_life_ms) {
        entry(&mut users, &owner).fair_share_usage = u;
    }
    let mut users: Vec<UserUsage> = users.into_values().collect();
    users.sort_by(|a, b| b.gpu_hours.total_cmp(&a.gpu_hours).then(a.user.cmp(&b.user)));
    UsageReport {
        since_ms: since,
        until_ms: now,
        fair_share_half_life_ms: half_life_ms,
        users,
    }
}

#[cfg(test)]
mod chart_tests {
    use super::*;

    /// GPU-hours are split at bucket edges (local midnight), clipped to the window, and a running
    /// attempt counts up to now.
    #[test]
    fn usage_is_split_into_buckets_per_user() {
        let h = 3_600_000;
        let day = 24 * h;
        let tz = 2 * h; // UTC+2: local midnight is 22:00 UTC
        let rows: Vec<UsageRow> = vec![
            ("ada".into(), 2, day - 3 * h, Some(day - h)), // 21:00-23:00 UTC: 1 h before, 1 h after local midnight, 2 GPUs
            ("bob".into(), 1, 2 * day - 4 * h, None),      // running since 20:00 UTC on day 1
            ("cy".into(), 0, 0, Some(day)),                // no GPU: not counted
            ("dee".into(), 1, -day, Some(-day + h)),       // before the window
        ];
        let b = usage_buckets(&rows, 0, 2 * day, day, tz);
        let got: Vec<(i64, &str, f64)> = b.iter().map(|x| (x.start, x.user.as_str(), x.gpu_hours)).collect();
        assert_eq!(
            got,
            vec![
                (-tz, "ada", 2.0),
                (day - tz, "ada", 2.0),
                (day - tz, "bob", 2.0),
                (2 * day - tz, "bob", 2.0)
            ]
        );
        let total: f64 = usage_buckets(&rows, 0, 2 * day, h, 0).iter().map(|x| x.gpu_hours).sum();
        assert_eq!(total, 8.0, "hourly buckets add up to the same GPU-hours");
    }
}
