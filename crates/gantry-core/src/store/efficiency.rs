//! Rows of how runs used what they held (`attempt_efficiency`, migration 17) and the GPU memory each
//! job shape was stopped for using (`learned_gpu_memory`), kept across restarts.

use rusqlite::params;

use super::{Result, Store};
use crate::efficiency::{AttemptUse, UsageAttempt};

const USE_COLS: &str = "attempt_id, job_id, cpus_milli, ram_held, cpu_ns, cpu_wall_ms, ram_peak, gpus, gpu_util_sum, \
     gpu_samples, gpu_shared, gpu_memory_peak, gpu_memory_simulated, gpu_memory_total";

fn use_from_row(r: &rusqlite::Row) -> rusqlite::Result<AttemptUse> {
    Ok(AttemptUse {
        attempt_id: r.get(0)?,
        job_id: r.get(1)?,
        cpus_milli: r.get::<_, i64>(2)?.max(0) as u64,
        ram_held: r.get::<_, Option<i64>>(3)?.map(|v| v.max(0) as u64),
        cpu_ns: r.get::<_, Option<i64>>(4)?.map(|v| v.max(0) as u64),
        cpu_wall_ms: r.get(5)?,
        ram_peak: r.get::<_, Option<i64>>(6)?.map(|v| v.max(0) as u64),
        gpus: r.get(7)?,
        gpu_util_sum: r.get(8)?,
        gpu_samples: r.get::<_, i64>(9)?.max(0) as u64,
        gpu_shared: r.get::<_, i64>(10)?.max(0) as u64,
        gpu_memory_peak: r.get::<_, Option<i64>>(11)?.map(|v| v.max(0) as u64),
        gpu_memory_simulated: r.get(12)?,
        gpu_memory_total: r.get::<_, Option<i64>>(13)?.map(|v| v.max(0) as u64),
    })
}

fn i(v: Option<u64>) -> Option<i64> {
    v.map(|v| v.min(i64::MAX as u64) as i64)
}

impl Store {
    /// Write an attempt's measures so far (replacing the last write).
    pub fn save_attempt_use(&self, u: &AttemptUse) -> Result<()> {
        self.conn
            .prepare_cached(&format!(
                "INSERT OR REPLACE INTO attempt_efficiency ({USE_COLS}) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"
            ))?
            .execute(params![
                u.attempt_id,
                u.job_id,
                u.cpus_milli as i64,
                i(u.ram_held),
                i(u.cpu_ns),
                u.cpu_wall_ms,
                i(u.ram_peak),
                u.gpus,
                u.gpu_util_sum,
                u.gpu_samples as i64,
                u.gpu_shared as i64,
                i(u.gpu_memory_peak),
                u.gpu_memory_simulated,
                i(u.gpu_memory_total),
            ])?;
        Ok(())
    }

    /// A job's attempts' measures, oldest attempt first.
    pub fn attempt_uses(&self, job_id: i64) -> Result<Vec<AttemptUse>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {USE_COLS} FROM attempt_efficiency WHERE job_id = ?1 ORDER BY attempt_id"
        ))?;
        let rows = st
            .query_map([job_id], use_from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Every attempt that ran in [since, until), with its measures where taken (`gantry usage
    /// --efficiency`).
    pub fn usage_attempts(&self, since: i64, until: i64) -> Result<Vec<UsageAttempt>> {
        let mut st = self.conn.prepare_cached(
            "SELECT j.owner, a.started_at, a.ended_at, json_array_length(a.gpus), \
                    e.gpu_util_sum, e.gpu_samples, e.cpu_ns, e.cpu_wall_ms, \
                    COALESCE(e.cpus_milli, json_extract(j.spec_json, '$.limits.cpus_milli'), 0) \
             FROM attempts a JOIN jobs j ON j.id = a.job_id \
             LEFT JOIN attempt_efficiency e ON e.attempt_id = a.id \
             WHERE (a.ended_at IS NULL OR a.ended_at >= ?1) AND a.started_at < ?2",
        )?;
        let rows = st
            .query_map([since, until], |r| {
                let util_sum: Option<f64> = r.get(4)?;
                let samples: Option<i64> = r.get(5)?;
                let cpus_milli = r.get::<_, i64>(8)?.max(0) as u64;
                let u = AttemptUse {
                    cpus_milli,
                    cpu_ns: r.get::<_, Option<i64>>(6)?.map(|v| v.max(0) as u64),
                    cpu_wall_ms: r.get(7)?,
                    ..Default::default()
                };
                Ok(UsageAttempt {
                    user: r.get(0)?,
                    start: r.get(1)?,
                    end: r.get(2)?,
                    gpus: r.get(3)?,
                    gpu_util: match (util_sum, samples) {
                        (Some(s), Some(n)) if n > 0 => Some(s / n as f64),
                        _ => None,
                    },
                    cpu: u.cpu(),
                    cpus_milli,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Remember the GPU memory a job shape (`shape`: its key as JSON) was stopped for using; the most
    /// it ever used is kept.
    pub fn save_learned_gpu_memory(&self, shape: &str, bytes: u64) -> Result<()> {
        let now = self.clock.now_ms();
        self.conn
            .prepare_cached(
                "INSERT INTO learned_gpu_memory (shape, bytes, at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT(shape) DO UPDATE SET bytes = MAX(bytes, excluded.bytes), at = excluded.at",
            )?
            .execute(params![shape, bytes.min(i64::MAX as u64) as i64, now])?;
        Ok(())
    }

    /// Every learned GPU memory: (shape as JSON, bytes).
    pub fn learned_gpu_memory(&self) -> Result<Vec<(String, u64)>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT shape, bytes FROM learned_gpu_memory")?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)?.max(0) as u64)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }
}
