//! Run history: filtered, sorted, paged queries (indexes, trigram search, cached counts), the timeline and retention.

use rusqlite::{params, Connection, OptionalExtension};

use super::*;

impl Store {
    /// The filter as SQL. `fts`: find text matches through the trigram index (worth it when they are few;
    /// for many, testing each row of a covering index is cheaper).
    pub(super) fn where_clause(f: &HistoryFilter, fts: bool) -> (String, Vec<rusqlite::types::Value>) {
        let mut sql = String::from(" WHERE j.finished_at IS NOT NULL");
        let mut args: Vec<rusqlite::types::Value> = vec![];
        let mut add = |cond: &str, v: rusqlite::types::Value| {
            args.push(v);
            sql += &cond.replace("?", &format!("?{}", args.len()));
        };
        if let Some(u) = &f.user {
            add(" AND j.owner = ?", u.clone().into());
        }
        if let Some(s) = f.status {
            add(" AND j.state = ?", s.as_str().to_string().into());
        }
        if let Some(s) = f.since {
            add(" AND j.finished_at >= ?", s.into());
        }
        if let Some(s) = f.until {
            add(" AND j.finished_at < ?", s.into());
        }
        if let Some(i) = &f.image {
            add(" AND j.image = ?", i.clone().into());
        }
        if let Some(t) = Self::text_of(f) {
            add(
                " AND (j.name LIKE ? ESCAPE '\\' OR j.image LIKE ? ESCAPE '\\')",
                like_pattern(t).into(),
            );
            // The trigram index finds the candidates (a superset: it folds case beyond ASCII); LIKE
            // above decides. It knows nothing of substrings shorter than 3 characters.
            if fts && t.chars().count() >= 3 {
                add(
                    " AND j.id IN (SELECT rowid FROM jobs_fts WHERE jobs_fts MATCH ?)",
                    format!("\"{}\"", t.replace('"', "\"\"")).into(),
                );
            }
        }
        (sql, args)
    }

    /// The text filter; an empty one matches everything, as no filter.
    pub(super) fn text_of(f: &HistoryFilter) -> Option<&str> {
        f.text.as_deref().filter(|t| !t.is_empty())
    }

    /// Completed runs, newest first (or as `sort` says), one page.
    pub fn history(&mut self, f: &HistoryFilter) -> Result<Vec<HistoryRow>> {
        let total = self.history_count(f)?;
        let broad = total > BROAD_FILTER;
        let (wh, args) = Self::where_clause(f, !broad);
        let (key, index) = match f.sort.as_deref().unwrap_or("finished") {
            "started" => ("j.started_at", "jobs_hs_started"),
            "duration" => ("j.duration_ms", "jobs_hs_duration"),
            "gpu_hours" => ("j.gpu_ms", "jobs_hs_gpu"),
            "name" => ("j.name", "jobs_hs_name"),
            "owner" => ("j.owner", "jobs_hs_owner"),
            "exit_code" => ("j.exit_code", "jobs_hs_exit"),
            "id" => ("j.id", "jobs_hs_id"),
            _ => ("j.finished_at", "jobs_hs_finished"),
        };
        let limit = f.limit.unwrap_or(100).min(10_000) as i64;
        let offset = f.offset.unwrap_or(0) as i64;
        // A page past the middle is read from the other end, in reverse: no walk passes more than half.
        let reverse = offset > total / 2 && offset < total;
        let (limit, offset) = if reverse {
            (limit.min(total - offset), (total - offset - limit).max(0))
        } else {
            (limit, offset)
        };
        let dir = if f.asc.unwrap_or(false) != reverse {
            "ASC"
        } else {
            "DESC"
        };
        // For a broad filter the planner would collect every match and sort it; walking the sort key's
        // covering index and filtering on the way reads only what the page needs.
        let hint = if broad {
            format!(" INDEXED BY {index}")
        } else {
            String::new()
        };
        let sql = format!(
            "SELECT j.id, j.name, j.owner, j.image, j.state, j.exit_code, a.gpus, a.gpu_uuids, j.submitted_at, j.started_at, j.finished_at, j.attempts \
             FROM (SELECT j.id AS pid FROM jobs j{hint}{wh} ORDER BY {key} {dir}, j.id {dir} LIMIT {limit} OFFSET {offset}) p \
             JOIN jobs j ON j.id = p.pid LEFT JOIN attempts a ON a.job_id = j.id AND a.n = j.attempts ORDER BY {key} {dir}, j.id {dir}",
        );
        let mut st = self.conn.prepare_cached(&sql)?;
        let mut rows = st
            .query_map(rusqlite::params_from_iter(args), |r| {
                let state: String = r.get(4)?;
                let gpus: Option<String> = r.get(6)?;
                let uuids: Option<String> = r.get(7)?;
                Ok(HistoryRow {
                    id: r.get(0)?,
                    name: r.get(1)?,
                    owner: r.get(2)?,
                    image: r.get(3)?,
                    status: JobState::parse(&state).unwrap_or(JobState::Failed),
                    exit_code: r.get(5)?,
                    gpus: gpus.and_then(|g| serde_json::from_str(&g).ok()).unwrap_or_default(),
                    gpu_uuids: uuids.and_then(|g| serde_json::from_str(&g).ok()).unwrap_or_default(),
                    submitted_at: r.get(8)?,
                    started_at: r.get(9)?,
                    finished_at: r.get(10)?,
                    attempts: r.get(11)?,
                    metric: None,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        if reverse {
            rows.reverse();
        }
        Ok(rows)
    }

    /// How many completed runs match (for paging). Counted once per filter, then kept exact by
    /// triggers (`history_counts`); when the cache cannot be written, counted every time.
    pub fn history_count(&mut self, f: &HistoryFilter) -> Result<i64> {
        let key = serde_json::to_string(&(&f.user, f.status, f.since, f.until, &f.image, Self::text_of(f)))?;
        let cached = |c: &Connection| {
            c.prepare_cached("SELECT n FROM history_counts WHERE key = ?1")?
                .query_row([&key], |r| r.get(0))
                .optional()
        };
        if let Some(n) = cached(&self.conn)? {
            return Ok(n);
        }
        // Count and record in one write transaction, so no job can end between the two unseen.
        let counted = (|| -> Result<i64> {
            let tx = self
                .conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let n = match cached(&tx)? {
                Some(n) => n,
                None => {
                    let n = Self::count_matches(&tx, f)?;
                    tx.execute(
                        "INSERT INTO history_counts (key, owner, state, since, until, image, text, n) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                        params![key, f.user, f.status.map(|s| s.as_str()), f.since, f.until, f.image, Self::text_of(f).map(like_pattern), n],
                    )?;
                    tx.execute("DELETE FROM history_counts WHERE rowid NOT IN (SELECT rowid FROM history_counts ORDER BY rowid DESC LIMIT ?1)", [CACHED_COUNTS])?;
                    n
                }
            };
            tx.commit()?;
            Ok(n)
        })();
        match counted {
            Ok(n) => Ok(n),
            Err(e) => {
                tracing::warn!("cannot cache the history count ({e}); counting every time");
                Self::count_matches(&self.conn, f)
            }
        }
    }

    /// COUNT(*) of the runs matching `f`, from the rows themselves.
    pub(super) fn count_matches(c: &Connection, f: &HistoryFilter) -> Result<i64> {
        // The trigram index's own count (a superset) says whether going through it pays.
        let fts = match Self::text_of(f).filter(|t| t.chars().count() >= 3) {
            Some(t) => {
                let q = format!("\"{}\"", t.replace('"', "\"\""));
                let candidates: i64 = c
                    .prepare_cached("SELECT COUNT(*) FROM jobs_fts WHERE jobs_fts MATCH ?1")?
                    .query_row([q], |r| r.get(0))?;
                candidates <= FTS_CANDIDATES_MAX
            }
            None => false,
        };
        let (wh, args) = Self::where_clause(f, fts);
        // Text tested row by row: on an index that holds every filter column (the planner may pick a
        // narrower one and read each job row).
        let hint = if Self::text_of(f).is_some() && !fts {
            " INDEXED BY jobs_hs_finished"
        } else {
            ""
        };
        Ok(c.prepare_cached(&format!("SELECT COUNT(*) FROM jobs j{hint}{wh}"))?
            .query_row(rusqlite::params_from_iter(args), |r| r.get(0))?)
    }

    /// Attempts that overlapped [from, to): which runs held which GPUs.
    pub fn timeline(&self, from: i64, to: i64) -> Result<Vec<TimelineRun>> {
        let mut st = self.conn.prepare_cached(
            "SELECT a.job_id, j.name, j.owner, a.gpus, a.started_at, a.ended_at, a.reason FROM attempts a JOIN jobs j ON j.id = a.job_id \
             WHERE a.started_at < ?2 AND (a.ended_at IS NULL OR a.ended_at >= ?1) ORDER BY a.started_at LIMIT 20000",
        )?;
        let rows = st
            .query_map(params![from, to], |r| {
                let gpus: String = r.get(3)?;
                Ok(TimelineRun {
                    job_id: r.get(0)?,
                    name: r.get(1)?,
                    owner: r.get(2)?,
                    gpus: serde_json::from_str(&gpus).unwrap_or_default(),
                    start: r.get(4)?,
                    end: r.get(5)?,
                    reason: r.get::<_, Option<String>>(6)?.and_then(|s| EndReason::parse(&s)),
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Ids of jobs that ended (succeeded, failed, cancelled, timed out) before `cutoff` (ms).
    pub fn ended_before(&self, cutoff: i64) -> Result<Vec<i64>> {
        let mut st = self.conn.prepare_cached(
            "SELECT id FROM jobs WHERE finished_at < ?1 AND state IN ('succeeded','failed','cancelled','timed_out') ORDER BY id",
        )?;
        let rows = st
            .query_map([cutoff], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Delete these jobs with their attempts and events; only jobs that have ended (a queued, held,
    /// starting or running job is never deleted, whatever the ids say). Returns the ids deleted.
    pub fn delete_ended(&mut self, ids: &[i64]) -> Result<Vec<i64>> {
        let mut gone = vec![];
        let tx = self.conn.transaction()?;
        for id in ids {
            let ended: bool = tx
                .query_row(
                    "SELECT state IN ('succeeded','failed','cancelled','timed_out') FROM jobs WHERE id = ?1",
                    [id],
                    |r| r.get(0),
                )
                .optional()?
                .unwrap_or(false);
            if ended {
                tx.execute("DELETE FROM events WHERE job_id = ?1", [id])?;
                tx.execute("DELETE FROM attempt_efficiency WHERE job_id = ?1", [id])?;
                tx.execute("DELETE FROM attempts WHERE job_id = ?1", [id])?;
                tx.execute("DELETE FROM jobs WHERE id = ?1", [id])?;
                gone.push(*id);
            }
        }
        tx.commit()?;
        Ok(gone)
    }
}
