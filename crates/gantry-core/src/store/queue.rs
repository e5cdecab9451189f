//! The queue: inserting jobs, the in-memory queue mirror, attempts and every state transition.

use rusqlite::{params, OptionalExtension};

use super::*;
use crate::spec::ValidJob;

/// The queued jobs in memory, kept up to date by the store's own transitions, so neither a submit
/// nor a scheduling pass reads the whole queue from SQLite. SQLite stays the truth: this is rebuilt
/// from it at open, and whenever a change could not be read back (`stale`).
#[derive(Debug, Default)]
pub struct QueueMirror {
    rows: std::collections::BTreeMap<i64, std::sync::Arc<QueuedRow>>,
    per_user: std::collections::HashMap<u32, usize>,
    stale: bool,
    /// Bumped by every change: a scheduling pass with the same version (and nothing else changed)
    /// would plan the same thing.
    version: u64,
}

pub type SharedQueue = std::sync::Arc<std::sync::Mutex<QueueMirror>>;

impl QueueMirror {
    /// The queued jobs, by id (cheap: the rows are shared).
    pub fn rows(&self) -> Vec<std::sync::Arc<QueuedRow>> {
        self.rows.values().cloned().collect()
    }
    /// How many jobs are queued.
    pub fn len(&self) -> usize {
        self.rows.len()
    }
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
    /// How many jobs `owner_uid` has queued.
    pub fn count_of(&self, owner_uid: u32) -> usize {
        self.per_user.get(&owner_uid).copied().unwrap_or(0)
    }
    /// A change could not be read back: rebuild with [`Store::track_queue`] before use.
    pub fn is_stale(&self) -> bool {
        self.stale
    }
    /// Does a queued job's retry backoff end in `(since, now]`? (Then a pass must plan again.)
    pub fn retry_due(&self, since: i64, now: i64) -> bool {
        self.rows
            .values()
            .any(|r| r.not_before.is_some_and(|t| t > since && t <= now))
    }
    /// Changes so far (see the field).
    pub fn version(&self) -> u64 {
        self.version
    }
    pub(super) fn set(&mut self, id: i64, row: Option<QueuedRow>) {
        self.version += 1;
        if let Some(old) = self.rows.remove(&id) {
            if let Some(n) = self.per_user.get_mut(&old.owner_uid) {
                *n -= 1;
                if *n == 0 {
                    self.per_user.remove(&old.owner_uid);
                }
            }
        }
        if let Some(r) = row {
            *self.per_user.entry(r.owner_uid).or_default() += 1;
            self.rows.insert(id, std::sync::Arc::new(r));
        }
    }
}

/// A submit's idempotency key, scoped by the submitter's uid: the same key from another uid is
/// another key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitKey {
    pub uid: u32,
    pub key: String,
    /// What was submitted: the same key sent with another spec is not the same submit.
    pub fingerprint: String,
}

/// What a key's first submit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedSubmit {
    pub job_ids: Vec<i64>,
    pub fingerprint: String,
}

impl Store {
    /// Insert a queued job. `finalize` may rewrite the job once its id is known (template mounts).
    pub fn insert_job(
        &mut self,
        job: &ValidJob,
        owner: &Owner,
        source: &str,
        source_key: Option<&str>,
        finalize: impl Fn(i64, &ValidJob) -> Option<ValidJob>,
    ) -> Result<i64> {
        self.insert_job_keyed(job, owner, source, source_key, None, finalize)
    }

    /// [`Store::insert_job`], recording in the same transaction that `key` queued this job after
    /// `earlier` (the jobs of the same submit inserted before it, in order): a crash never keeps
    /// the job without its key, or the key without its job.
    pub fn insert_job_keyed(
        &mut self,
        job: &ValidJob,
        owner: &Owner,
        source: &str,
        source_key: Option<&str>,
        key: Option<(&SubmitKey, &[i64])>,
        finalize: impl Fn(i64, &ValidJob) -> Option<ValidJob>,
    ) -> Result<i64> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        tx.prepare_cached(
            "INSERT INTO jobs (name, owner_uid, owner_gid, owner, image, gpus, gpu_memory, priority, retries, timeout_ms, \
             spec_json, state, source, source_key, submitted_at, expected_runtime_ms, after_ids, not_before) \
             VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,'queued',?12,?13,?14,?15,?16,?17)",
        )?
        .execute(params![
            job.name,
            owner.uid,
            owner.gid,
            owner.name,
            job.spec.image,
            job.gpus,
            job.gpu_memory.map(|m| m as i64),
            job.spec.priority,
            job.retries,
            job.timeout.map(|t| t.as_millis() as i64),
            serde_json::to_string(job)?,
            source,
            source_key,
            now,
            job.expected_runtime.map(|d| d.as_millis() as i64),
            after_json(job)?,
            // A `begin` waits like a retry's backoff: out of the plan, holding nothing, until then.
            job.begin_ms
        ])?;
        let id = tx.last_insert_rowid();
        if let Some(j) = finalize(id, job) {
            tx.execute(
                "UPDATE jobs SET spec_json = ?2, name = ?3, after_ids = ?4 WHERE id = ?1",
                params![id, serde_json::to_string(&j)?, j.name, after_json(&j)?],
            )?;
        }
        Self::event(
            &tx,
            id,
            now,
            None,
            JobState::Queued,
            Some(&format!("submitted from {source}")),
        )?;
        if let Some((k, earlier)) = key {
            if earlier.is_empty() {
                Self::forget_keys(&tx, k.uid, now)?;
            }
            let ids: Vec<i64> = earlier.iter().copied().chain([id]).collect();
            tx.prepare_cached("INSERT OR REPLACE INTO submit_keys (uid, key, fingerprint, job_ids, created_at) VALUES (?1, ?2, ?3, ?4, ?5)")?
                .execute(params![k.uid, k.key, k.fingerprint, serde_json::to_string(&ids)?, now])?;
        }
        tx.commit()?;
        self.requeue_check(id);
        Ok(id)
    }

    /// The jobs a submit with this key (sent by `uid`) queued within the last `SUBMIT_KEY_TTL`.
    pub fn keyed_submit(&self, uid: u32, key: &str) -> Result<Option<KeyedSubmit>> {
        let since = self.now() - crate::defaults::SUBMIT_KEY_TTL.as_millis() as i64;
        let row: Option<(String, String)> = self
            .conn
            .prepare_cached(
                "SELECT job_ids, fingerprint FROM submit_keys WHERE uid = ?1 AND key = ?2 AND created_at > ?3",
            )?
            .query_row(params![uid, key, since], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        Ok(match row {
            Some((ids, fingerprint)) => Some(KeyedSubmit {
                job_ids: serde_json::from_str(&ids)?,
                fingerprint,
            }),
            None => None,
        })
    }

    /// Before `uid` records a new key: every key past its day goes, and `uid`'s oldest go until
    /// there is room for one more under `SUBMIT_KEYS_PER_USER`.
    fn forget_keys(tx: &Connection, uid: u32, now: i64) -> Result<()> {
        let expired = now - crate::defaults::SUBMIT_KEY_TTL.as_millis() as i64;
        tx.prepare_cached("DELETE FROM submit_keys WHERE created_at <= ?1")?
            .execute([expired])?;
        tx.prepare_cached(
            "DELETE FROM submit_keys WHERE rowid IN (SELECT rowid FROM submit_keys WHERE uid = ?1 ORDER BY created_at, rowid \
             LIMIT max(0, (SELECT COUNT(*) FROM submit_keys WHERE uid = ?1) - ?2 + 1))",
        )?
        .execute(params![uid, crate::defaults::SUBMIT_KEYS_PER_USER])?;
        Ok(())
    }

    /// Queued jobs of one user (for the per-user cap): from the queue in memory when this store keeps it.
    pub fn queued_count(&self, owner_uid: u32) -> Result<usize> {
        if let Some(q) = &self.queue {
            let q = q.lock().unwrap_or_else(|p| p.into_inner());
            if !q.stale {
                return Ok(q.count_of(owner_uid));
            }
        }
        let n: i64 = self
            .conn
            .prepare_cached("SELECT COUNT(*) FROM jobs WHERE owner_uid = ?1 AND state = 'queued'")?
            .query_row([owner_uid], |r| r.get(0))?;
        Ok(n as usize)
    }

    /// GPUs the owner's interactive sessions ask for, queued, starting and running together.
    pub fn open_session_gpus(&self, owner_uid: u32) -> Result<u32> {
        let n: i64 = self
            .conn
            .prepare_cached(
                "SELECT COALESCE(SUM(gpus), 0) FROM jobs WHERE owner_uid = ?1 AND state IN ('queued','starting','running') \
                 AND state IN ('queued','starting','running') AND json_extract(spec_json, '$.spec.interactive') = 1",
            )?
            .query_row([owner_uid], |r| r.get(0))?;
        Ok(n as u32)
    }

    /// Keep the queue in memory from now on: built from the database now (call again when it went
    /// stale), then updated by every change this connection commits.
    pub fn track_queue(&mut self) -> Result<SharedQueue> {
        let mut m = QueueMirror::default();
        for r in self.queued_rows()? {
            m.set(r.id, Some(r));
        }
        let q = self.queue.clone().unwrap_or_default();
        let mut old = q.lock().unwrap_or_else(|p| p.into_inner());
        // Versions only grow, across rebuilds too.
        m.version += old.version + 1;
        *old = m;
        drop(old);
        self.queue = Some(q.clone());
        Ok(q)
    }

    /// After a committed change to job `id`: its queued row (if it is still queued) into the queue in memory.
    pub(super) fn requeue_check(&self, id: i64) {
        let Some(q) = &self.queue else { return };
        let row = self
            .conn
            .prepare_cached(&format!("{QUEUED_SELECT} AND id = ?1"))
            .and_then(|mut st| st.query_row([id], queued_from_row).optional());
        let mut q = q.lock().unwrap_or_else(|p| p.into_inner());
        match row {
            Ok(row) => q.set(id, row),
            Err(e) => {
                tracing::warn!(
                    "cannot read job {id} back into the queue in memory ({e}); it is rebuilt from the database"
                );
                q.stale = true;
            }
        }
    }

    /// Open attempts with their jobs (for recovery).
    pub fn open_attempts(&self) -> Result<Vec<(Job, Attempt)>> {
        let mut out = vec![];
        // Not `active_jobs`: that would parse every queued job's spec (a restart with 100k queued).
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {JOB_COLS} FROM jobs WHERE state IN ('starting','running') ORDER BY id"
        ))?;
        let started = st.query_map([], job_from_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
        for j in started {
            if let Some(a) = self.open_attempt(j.id)? {
                out.push((j, a));
            }
        }
        Ok(out)
    }

    /// Does any attempt of this job carry this container id?
    pub fn attempt_with_container(&self, job_id: i64, container_id: &str) -> Result<Option<Attempt>> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {ATTEMPT_COLS} FROM attempts WHERE job_id = ?1 AND container_id = ?2"
            ))?
            .query_row(params![job_id, container_id], attempt_from_row)
            .optional()?)
    }

    pub fn job_by_source_key(&self, key: &str) -> Result<Option<i64>> {
        Ok(self
            .conn
            .query_row("SELECT id FROM jobs WHERE source_key = ?1", [key], |r| r.get(0))
            .optional()?)
    }

    pub fn job(&self, id: i64) -> Result<Option<Job>> {
        Ok(self
            .conn
            .prepare_cached(&format!("SELECT {JOB_COLS} FROM jobs WHERE id = ?1"))?
            .query_row([id], job_from_row)
            .optional()?)
    }

    /// Queued jobs, light rows for the scheduler (no spec parsing).
    pub fn queued_rows(&self) -> Result<Vec<QueuedRow>> {
        let mut st = self
            .conn
            .prepare_cached(&format!("{QUEUED_SELECT} ORDER BY priority DESC, submitted_at, id"))?;
        let rows = st
            .query_map([], queued_from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Jobs starting or running, as the queue shows them (no spec parsing), by id.
    pub fn started_rows(&self) -> Result<Vec<QueueJob>> {
        let mut st = self.conn.prepare_cached(STARTED_SELECT)?;
        let rows = st
            .query_map([], started_from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Jobs that are queued, starting or running, in submission order.
    pub fn active_jobs(&self) -> Result<Vec<Job>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {JOB_COLS} FROM jobs WHERE state IN ('queued','starting','running') ORDER BY id"
        ))?;
        let rows = st.query_map([], job_from_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    pub fn attempts(&self, job_id: i64) -> Result<Vec<Attempt>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {ATTEMPT_COLS} FROM attempts WHERE job_id = ?1 ORDER BY n"
        ))?;
        let rows = st
            .query_map([job_id], attempt_from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// The attempt that has not ended yet, if any.
    pub fn open_attempt(&self, job_id: i64) -> Result<Option<Attempt>> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {ATTEMPT_COLS} FROM attempts WHERE job_id = ?1 AND ended_at IS NULL"
            ))?
            .query_row([job_id], attempt_from_row)
            .optional()?)
    }

    pub fn events(&self, job_id: i64) -> Result<Vec<Event>> {
        let mut st = self.conn.prepare_cached(
            "SELECT job_id, at, from_state, to_state, message FROM events WHERE job_id = ?1 ORDER BY id",
        )?;
        let rows = st
            .query_map([job_id], |r| {
                Ok(Event {
                    job_id: r.get(0)?,
                    at: r.get(1)?,
                    from: r.get(2)?,
                    to: r.get(3)?,
                    message: r.get(4)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// queued -> starting, with a new attempt row. Returns `None` if the job is no longer queued:
    /// this compare-and-set is what guarantees a job never starts twice.
    pub fn begin_attempt(&mut self, job_id: i64, gpus: &[u32], uuids: &[String]) -> Result<Option<Attempt>> {
        self.begin_attempt_noted(job_id, gpus, uuids, None)
    }

    /// [`Store::begin_attempt`], with a note on the placement in its event ("GPUs 0,1: NVLink").
    pub fn begin_attempt_noted(
        &mut self,
        job_id: i64,
        gpus: &[u32],
        uuids: &[String],
        note: Option<&str>,
    ) -> Result<Option<Attempt>> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        let changed = tx.execute(
            "UPDATE jobs SET state = 'starting', attempts = attempts + 1, not_before = NULL, started_at = COALESCE(started_at, ?2) \
             WHERE id = ?1 AND state = 'queued' AND cancel_requested = 0 AND held = 0",
            params![job_id, now],
        )?;
        if changed == 0 {
            return Ok(None);
        }
        let n: u32 = tx.query_row("SELECT attempts FROM jobs WHERE id = ?1", [job_id], |r| r.get(0))?;
        tx.execute(
            "INSERT INTO attempts (job_id, n, gpus, gpu_uuids, started_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                job_id,
                n,
                serde_json::to_string(gpus)?,
                serde_json::to_string(uuids)?,
                now
            ],
        )?;
        let aid = tx.last_insert_rowid();
        let gl = if gpus.is_empty() {
            "no GPU".to_string()
        } else {
            format!(
                "GPU {}",
                gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(",")
            )
        };
        let note = note.map(|n| format!(" ({n})")).unwrap_or_default();
        Self::event(
            &tx,
            job_id,
            now,
            Some(JobState::Queued),
            JobState::Starting,
            Some(&format!("attempt {n} on {gl}{note}")),
        )?;
        let a = tx.query_row(
            &format!("SELECT {ATTEMPT_COLS} FROM attempts WHERE id = ?1"),
            [aid],
            attempt_from_row,
        )?;
        tx.commit()?;
        self.requeue_check(job_id);
        Ok(Some(a))
    }

    /// Record what runs an attempt: its container (right after create), or its Slurm id (right after
    /// `sbatch` answers). The other form's columns stay empty. Read back by [`Attempt::run_ref`].
    pub fn set_run(&mut self, attempt_id: i64, run: &RunRef) -> Result<()> {
        match run {
            RunRef::Container(c) => self.conn.execute(
                "UPDATE attempts SET container_id = ?2 WHERE id = ?1",
                params![attempt_id, c],
            )?,
            RunRef::Slurm { id, task } => self.conn.execute(
                "UPDATE attempts SET slurm_job_id = ?2, slurm_array_task = ?3 WHERE id = ?1",
                params![attempt_id, *id as i64, task],
            )?,
        };
        Ok(())
    }

    /// Record, before the attempt is signalled, that it is being preempted: for which job, and the
    /// reason its end will show. False: the attempt has already ended.
    pub fn mark_preempting(&mut self, attempt_id: i64, for_job: i64, why: &str) -> Result<bool> {
        Ok(self.conn.execute(
            "UPDATE attempts SET preempt_for = ?2, preempt_why = ?3 WHERE id = ?1 AND ended_at IS NULL",
            params![attempt_id, for_job, why],
        )? == 1)
    }

    /// Record that a preempted attempt is about to get its checkpoint signal (once: an earlier mark
    /// stays). Returns when it was first sent, if it was before this call.
    pub fn preempt_signalled(&mut self, attempt_id: i64) -> Result<Option<i64>> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        let before: Option<i64> = tx
            .query_row(
                "SELECT preempt_signalled_ms FROM attempts WHERE id = ?1",
                [attempt_id],
                |r| r.get(0),
            )
            .optional()?
            .flatten();
        if before.is_none() {
            tx.execute(
                "UPDATE attempts SET preempt_signalled_ms = ?2 WHERE id = ?1",
                params![attempt_id, now],
            )?;
        }
        tx.commit()?;
        Ok(before)
    }

    /// The preemption recorded for an attempt (for which job, why), if any.
    pub fn preempting(&self, attempt_id: i64) -> Result<Option<(i64, String)>> {
        Ok(self
            .conn
            .prepare_cached("SELECT preempt_for, preempt_why FROM attempts WHERE id = ?1 AND preempt_for IS NOT NULL")?
            .query_row([attempt_id], |r| {
                Ok((r.get(0)?, r.get::<_, Option<String>>(1)?.unwrap_or_default()))
            })
            .optional()?)
    }

    /// How often a job's attempts ended by preemption: all of them, and those since `since` (ms).
    pub fn preemptions(&self, job_id: i64, since: i64) -> Result<(u32, u32, Option<i64>)> {
        Ok(self.conn.prepare_cached(
            "SELECT COUNT(*), COALESCE(SUM(ended_at >= ?2), 0), MAX(ended_at) FROM attempts WHERE job_id = ?1 AND reason = 'preempted'",
        )?
        .query_row(params![job_id, since], |r| Ok((r.get::<_, i64>(0)? as u32, r.get::<_, i64>(1)? as u32, r.get(2)?)))?)
    }

    /// The jobs a job's attempts were preempted for (no loop: they may not preempt it now).
    pub fn preempted_for(&self, job_id: i64) -> Result<Vec<i64>> {
        let mut st = self.conn.prepare_cached(
            "SELECT DISTINCT preempt_for FROM attempts WHERE job_id = ?1 AND preempt_for IS NOT NULL",
        )?;
        let v = st
            .query_map([job_id], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<i64>>>()?;
        Ok(v)
    }

    /// The jobs preempted so that this one could start (no loop: they may not preempt it).
    pub fn took_from(&self, job_id: i64) -> Result<Vec<i64>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT DISTINCT job_id FROM attempts WHERE preempt_for = ?1")?;
        let v = st
            .query_map([job_id], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<i64>>>()?;
        Ok(v)
    }

    /// The GPUs Slurm gave a running attempt (indexes on its node), for `gantry ls` and the GPUs view.
    pub fn set_attempt_gpus(&mut self, attempt_id: i64, gpus: &[u32]) -> Result<()> {
        self.conn.execute(
            "UPDATE attempts SET gpus = ?2 WHERE id = ?1",
            params![attempt_id, serde_json::to_string(gpus)?],
        )?;
        Ok(())
    }

    /// When the attempt really began running (the Slurm backend: Slurm's start, not the submission).
    /// The job's start moves too while this is its first attempt, so history and waits count Slurm's queue as waiting.
    pub fn set_attempt_started(&mut self, job_id: i64, attempt_id: i64, at: i64) -> Result<()> {
        let tx = self.conn.transaction()?;
        tx.execute(
            "UPDATE attempts SET started_at = ?2 WHERE id = ?1",
            params![attempt_id, at],
        )?;
        tx.execute(
            "UPDATE jobs SET started_at = ?2 WHERE id = ?1 AND attempts = 1",
            params![job_id, at],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// starting -> running.
    pub fn set_running(&mut self, job_id: i64) -> Result<bool> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        let n = tx.execute(
            "UPDATE jobs SET state = 'running' WHERE id = ?1 AND state = 'starting'",
            [job_id],
        )?;
        if n == 1 {
            Self::event(&tx, job_id, now, Some(JobState::Starting), JobState::Running, None)?;
        }
        tx.commit()?;
        Ok(n == 1)
    }

    /// Close the open attempt and move the job to its next state, atomically.
    pub fn end_attempt(&mut self, job_id: i64, attempt_id: i64, end: &Ending) -> Result<()> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        let closed = tx.execute(
            "UPDATE attempts SET ended_at = ?2, exit_code = ?3, reason = ?4, message = ?5 WHERE id = ?1 AND ended_at IS NULL",
            params![attempt_id, now, end.exit_code, end.reason.as_str(), end.message],
        )?;
        if closed == 0 {
            return Ok(()); // already recorded (e.g. by recovery): record once
        }
        let from: String = tx.query_row("SELECT state FROM jobs WHERE id = ?1", [job_id], |r| r.get(0))?;
        let finished = if end.next.is_final() { Some(now) } else { None };
        tx.execute(
            "UPDATE jobs SET state = ?2, exit_code = ?3, finished_at = ?4, not_before = ?5, message = ?6, \
             duration_ms = ?4 - started_at, gpu_ms = (?4 - started_at) * gpus WHERE id = ?1",
            params![
                job_id,
                end.next.as_str(),
                end.exit_code,
                finished,
                end.not_before,
                end.message
            ],
        )?;
        let msg = match (&end.message, end.exit_code) {
            (Some(m), _) => m.clone(),
            (None, Some(c)) => format!("{} with code {c}", end.reason.as_str()),
            (None, None) => end.reason.as_str().to_string(),
        };
        Self::event(&tx, job_id, now, JobState::parse(&from), end.next, Some(&msg))?;
        tx.commit()?;
        self.requeue_check(job_id); // a retry is queued again
        Ok(())
    }

    /// An event on a job that does not change its state (an idle warning), with `msg`.
    pub fn note_event(&mut self, job_id: i64, msg: &str) -> Result<()> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        let st: Option<String> = tx
            .query_row("SELECT state FROM jobs WHERE id = ?1", [job_id], |r| r.get(0))
            .optional()?;
        if let Some(st) = st.and_then(|s| JobState::parse(&s)) {
            Self::event(&tx, job_id, now, Some(st), st, Some(msg))?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Ask to cancel. A queued job is cancelled at once; a starting/running one is flagged for the
    /// executor. Returns the state before, or `None` when the job does not exist.
    pub fn request_cancel(&mut self, job_id: i64) -> Result<Option<JobState>> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        let st: Option<String> = tx
            .query_row("SELECT state FROM jobs WHERE id = ?1", [job_id], |r| r.get(0))
            .optional()?;
        let Some(st) = st.and_then(|s| JobState::parse(&s)) else {
            return Ok(None);
        };
        match st {
            JobState::Queued => {
                tx.execute(
                    "UPDATE jobs SET state = 'cancelled', cancel_requested = 1, finished_at = ?2 WHERE id = ?1",
                    params![job_id, now],
                )?;
                Self::event(
                    &tx,
                    job_id,
                    now,
                    Some(st),
                    JobState::Cancelled,
                    Some("cancelled while queued"),
                )?;
            }
            JobState::Starting | JobState::Running => {
                tx.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?1", [job_id])?;
            }
            _ => {}
        }
        tx.commit()?;
        self.requeue_check(job_id);
        Ok(Some(st))
    }

    pub fn set_priority(&mut self, job_id: i64, priority: i32) -> Result<bool> {
        let changed = self.conn.execute(
            "UPDATE jobs SET priority = ?2 WHERE id = ?1 AND state = 'queued'",
            params![job_id, priority],
        )? == 1;
        self.requeue_check(job_id);
        Ok(changed)
    }

    /// Hold or release a queued job, with an event naming who did it. Returns false (and changes
    /// nothing) when the job is not queued or already in that state.
    pub fn set_held(&mut self, job_id: i64, held: bool, by: &str) -> Result<bool> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        let n = tx.execute(
            "UPDATE jobs SET held = ?2 WHERE id = ?1 AND state = 'queued' AND held != ?2",
            params![job_id, held],
        )?;
        if n == 1 {
            let msg = if held {
                format!("held by {by}")
            } else {
                format!("released by {by}")
            };
            Self::event(&tx, job_id, now, Some(JobState::Queued), JobState::Queued, Some(&msg))?;
        }
        tx.commit()?;
        self.requeue_check(job_id);
        Ok(n == 1)
    }

    /// The caller's most recent job with this name (for `after: [name]`).
    pub fn latest_by_name(&self, owner_uid: u32, name: &str) -> Result<Option<i64>> {
        Ok(self
            .conn
            .prepare_cached("SELECT id FROM jobs WHERE owner_uid = ?1 AND name = ?2 ORDER BY id DESC LIMIT 1")?
            .query_row(params![owner_uid, name], |r| r.get(0))
            .optional()?)
    }

    pub fn state_of(&self, id: i64) -> Result<Option<JobState>> {
        let s: Option<String> = self
            .conn
            .prepare_cached("SELECT state FROM jobs WHERE id = ?1")?
            .query_row([id], |r| r.get(0))
            .optional()?;
        Ok(s.and_then(|s| JobState::parse(&s)))
    }

    /// queued -> failed without an attempt (e.g. a dependency failed).
    pub fn fail_queued(&mut self, id: i64, message: &str) -> Result<bool> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        let n = tx.execute(
            "UPDATE jobs SET state = 'failed', finished_at = ?2, message = ?3 WHERE id = ?1 AND state = 'queued'",
            params![id, now, message],
        )?;
        if n == 1 {
            Self::event(&tx, id, now, Some(JobState::Queued), JobState::Failed, Some(message))?;
        }
        tx.commit()?;
        self.requeue_check(id);
        Ok(n == 1)
    }
}

#[cfg(test)]
mod key_tests {
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::defaults::{SUBMIT_KEYS_PER_USER, SUBMIT_KEY_TTL};
    use crate::spec::{validate_text, Format, Origin};

    struct At(AtomicI64);
    impl crate::clock::Clock for At {
        fn now_ms(&self) -> i64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    fn keyed(s: &mut Store, uid: u32, key: &str, earlier: &[i64]) -> i64 {
        let job = validate_text("image: a\n", Format::Yaml, &Origin::default()).unwrap();
        let owner = Owner {
            uid,
            gid: uid,
            name: format!("u{uid}"),
        };
        let k = SubmitKey {
            uid,
            key: key.into(),
            fingerprint: "f".into(),
        };
        s.insert_job_keyed(&job, &owner, "api", None, Some((&k, earlier)), |_, _| None)
            .unwrap()
    }

    fn keys_of(s: &Store, uid: u32) -> i64 {
        s.conn
            .query_row("SELECT COUNT(*) FROM submit_keys WHERE uid = ?1", [uid], |r| r.get(0))
            .unwrap()
    }

    /// A key is found by its own uid only, lists every job of its submit, is forgotten after a day,
    /// and one uid holds at most `SUBMIT_KEYS_PER_USER` (its oldest go; nobody else's do).
    #[test]
    fn submit_keys_are_per_uid_kept_a_day_and_bounded_per_uid() {
        let mut s = Store::open_in_memory().unwrap();
        let clock = Arc::new(At(AtomicI64::new(1_000_000_000)));
        s.set_clock(clock.clone());
        let a = keyed(&mut s, 1000, "k1", &[]);
        let b = keyed(&mut s, 1000, "k1", &[a]); // the second job of a matrix
        assert_eq!(
            s.keyed_submit(1000, "k1").unwrap(),
            Some(KeyedSubmit {
                job_ids: vec![a, b],
                fingerprint: "f".into()
            })
        );
        assert_eq!(
            s.keyed_submit(1001, "k1").unwrap(),
            None,
            "another uid's same key is another key"
        );

        clock.0.fetch_add(SUBMIT_KEY_TTL.as_millis() as i64, Ordering::SeqCst);
        assert_eq!(s.keyed_submit(1000, "k1").unwrap(), None, "forgotten after a day");
        keyed(&mut s, 1001, "fresh", &[]);
        assert_eq!(keys_of(&s, 1000), 0, "expired keys are deleted when a key is recorded");

        // uid 1000 at its bound (bulk-loaded), and a newer key of uid 1002.
        let now = clock.0.load(Ordering::SeqCst);
        s.conn
            .execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) \
                 INSERT INTO submit_keys (uid, key, fingerprint, job_ids, created_at) SELECT 1000, 'old-' || i, 'f', '[1]', ?2 + i FROM n",
                params![SUBMIT_KEYS_PER_USER, now - 1_000_000],
            )
            .unwrap();
        keyed(&mut s, 1002, "other", &[]);
        let newest = keyed(&mut s, 1000, "newest", &[]);
        assert_eq!(keys_of(&s, 1000), SUBMIT_KEYS_PER_USER, "bounded");
        assert!(
            s.keyed_submit(1000, "old-1").unwrap().is_none(),
            "the oldest went first"
        );
        assert!(s.keyed_submit(1000, "old-2").unwrap().is_some());
        assert_eq!(s.keyed_submit(1000, "newest").unwrap().unwrap().job_ids, [newest]);
        assert!(
            s.keyed_submit(1002, "other").unwrap().is_some() && s.keyed_submit(1001, "fresh").unwrap().is_some(),
            "other users' keys stay"
        );
    }
}
