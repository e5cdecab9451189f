//! What runs achieved (migration 0016): each job's metric series across its attempts, their points
//! thinned to the lab's bound, params and tags, how reading went, and where each reader got to.
//! A read is written in one transaction with its cursor, so a restart neither loses nor repeats a
//! point. Compare and `history --metric` read the per-series summary, never the points.

use std::collections::{BTreeMap, HashMap, HashSet};

use rusqlite::{params, OptionalExtension, Transaction};

use super::{Result, Store};
use crate::protocol::{Goal, IngestReport, JobResults, MetricPoint, MetricSeries, MetricSource, Num};

/// Bounds on what one job's results hold (`[results]` of the lab config; reasons in `defaults`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResultsLimits {
    pub max_points: u32,
    pub max_series: u32,
    pub max_name_len: u32,
    pub max_bytes: u64,
}

impl Default for ResultsLimits {
    fn default() -> Self {
        use crate::defaults::*;
        ResultsLimits {
            max_points: RESULTS_MAX_POINTS,
            max_series: RESULTS_MAX_SERIES,
            max_name_len: RESULTS_MAX_NAME_LEN,
            max_bytes: RESULTS_MAX_BYTES,
        }
    }
}

/// One value a job logged.
#[derive(Debug, Clone, PartialEq)]
pub struct Logged {
    pub name: String,
    pub step: Option<i64>,
    pub at: i64,
    pub value: f64,
}

/// Where a reader got to in one file of one attempt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cursor {
    pub key: String,
    pub offset: u64,
    pub lines: u64,
}

/// What one read of one source gave: written at once, with where the read got to.
#[derive(Debug, Clone)]
pub struct ResultsBatch {
    pub source: MetricSource,
    pub points: Vec<Logged>,
    pub params: Vec<(String, String)>,
    pub tags: Vec<(String, String)>,
    pub garbage_lines: u64,
    pub bad_records: u64,
    pub bytes: u64,
    /// Bytes left unread in a file once the job's `max_bytes` were read (0: not reached).
    pub bytes_unread: u64,
    /// Each added once per job (the counters say how often).
    pub notes: Vec<String>,
    pub cursor: Option<Cursor>,
}

impl ResultsBatch {
    pub fn new(source: MetricSource) -> ResultsBatch {
        ResultsBatch {
            source,
            points: vec![],
            params: vec![],
            tags: vec![],
            garbage_lines: 0,
            bad_records: 0,
            bytes: 0,
            bytes_unread: 0,
            notes: vec![],
            cursor: None,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
            && self.params.is_empty()
            && self.tags.is_empty()
            && self.garbage_lines == 0
            && self.bad_records == 0
            && self.bytes == 0
            && self.bytes_unread == 0
            && self.notes.is_empty()
            && self.cursor.is_none()
    }
}

/// A series' summary as a comparison reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesSummary {
    pub name: String,
    pub goal: Goal,
    pub last: f64,
    pub best: Option<f64>,
}

/// A run's series summaries (by name) and params, as a comparison shows them.
pub type RunResults = (Vec<SeriesSummary>, BTreeMap<String, String>);

/// Notes kept per job at most (each kind of problem once).
const MAX_NOTES: usize = 20;

struct Series {
    id: i64,
    goal: Goal,
    last: f64,
    last_step: i64,
    last_attempt: u32,
    best: Option<f64>,
    best_step: Option<i64>,
    count: i64,
    stored: i64,
    next_seq: i64,
    dirty: bool,
}

fn load_series(tx: &Transaction, job_id: i64, name: &str) -> rusqlite::Result<Option<Series>> {
    tx.prepare_cached(
        "SELECT id, goal, last, last_step, last_attempt, best, best_step, count, stored, next_seq \
         FROM metric_series WHERE job_id = ?1 AND name = ?2",
    )?
    .query_row(params![job_id, name], |r| {
        Ok(Series {
            id: r.get(0)?,
            goal: if r.get::<_, String>(1)? == "min" {
                Goal::Min
            } else {
                Goal::Max
            },
            last: r.get::<_, Option<f64>>(2)?.unwrap_or(f64::NAN),
            last_step: r.get(3)?,
            last_attempt: r.get(4)?,
            best: r.get(5)?,
            best_step: r.get(6)?,
            count: r.get(7)?,
            stored: r.get(8)?,
            next_seq: r.get(9)?,
            dirty: false,
        })
    })
    .optional()
}

/// `value` stored: NaN as NULL (what SQLite makes of it anyway).
fn stored(v: f64) -> Option<f64> {
    (!v.is_nan()).then_some(v)
}

/// Which of `values` (in order) to keep so that at most about `max` stay: the first, the last, the
/// lowest and the highest finite ones always, the rest evenly.
pub fn thin(values: &[f64], max: usize) -> Vec<bool> {
    let n = values.len();
    let mut keep = vec![true; n];
    if n <= max.max(4) {
        return keep;
    }
    let mut protect = HashSet::from([0, n - 1]);
    let finite = values.iter().enumerate().filter(|(_, v)| v.is_finite());
    if let Some((i, _)) = finite.clone().min_by(|a, b| a.1.total_cmp(b.1)) {
        protect.insert(i);
    }
    if let Some((i, _)) = finite.max_by(|a, b| a.1.total_cmp(b.1)) {
        protect.insert(i);
    }
    // Keep every k-th of the rest, k chosen so that the kept ones fit.
    let room = max.saturating_sub(protect.len()).max(1);
    let rest = n - protect.len();
    let stride = rest.div_ceil(room).max(1);
    let mut j = 0;
    for (i, k) in keep.iter_mut().enumerate() {
        if protect.contains(&i) {
            continue;
        }
        *k = j % stride == 0;
        j += 1;
    }
    keep
}

impl Store {
    /// Where the reader of `key` in attempt `attempt` of `job_id` got to (nothing read: zeros).
    pub fn results_cursor(&self, job_id: i64, attempt: u32, key: &str) -> Result<Cursor> {
        let c = self
            .conn
            .prepare_cached("SELECT offset, lines FROM metric_cursors WHERE job_id = ?1 AND attempt = ?2 AND key = ?3")?
            .query_row(params![job_id, attempt, key], |r| {
                Ok(Cursor {
                    key: key.to_string(),
                    offset: r.get::<_, i64>(0)? as u64,
                    lines: r.get::<_, i64>(1)? as u64,
                })
            })
            .optional()?;
        Ok(c.unwrap_or(Cursor {
            key: key.to_string(),
            ..Default::default()
        }))
    }

    /// Bytes read from the job's metric files so far (all attempts, all sources).
    pub fn results_bytes(&self, job_id: i64) -> Result<u64> {
        let b: Option<i64> = self
            .conn
            .prepare_cached("SELECT bytes_read FROM job_ingest WHERE job_id = ?1")?
            .query_row([job_id], |r| r.get(0))
            .optional()?;
        Ok(b.unwrap_or(0) as u64)
    }

    /// Write one read of a job's results: points (each series bounded and thinned), params, tags,
    /// counters, notes and the reader's cursor, in one transaction.
    pub fn add_results(&mut self, job_id: i64, attempt: u32, b: &ResultsBatch, lim: &ResultsLimits) -> Result<()> {
        let tx = self.conn.transaction()?;
        tx.execute("INSERT OR IGNORE INTO job_ingest (job_id) VALUES (?1)", [job_id])?;
        let mut series: HashMap<&str, Series> = HashMap::new();
        let mut have: i64 = tx.query_row("SELECT COUNT(*) FROM metric_series WHERE job_id = ?1", [job_id], |r| {
            r.get(0)
        })?;
        // Once the job has all its series, a name not among them is dropped without a query (a
        // million distinct names cost a million lookups otherwise).
        let mut known: Option<HashSet<String>> = None;
        // A batch with more points of one name than its series keeps is thinned here, before the
        // database sees it (a flood of tiny lines costs no insert per point); the series' count,
        // last and best still see every point.
        let mut pre_thinned: HashMap<&str, (Vec<bool>, usize)> = HashMap::new();
        if b.points.len() > lim.max_points as usize {
            let mut counts: HashMap<&str, usize> = HashMap::new();
            for p in &b.points {
                *counts.entry(p.name.as_str()).or_default() += 1;
            }
            counts.retain(|_, n| *n > lim.max_points as usize);
            for name in counts.into_keys() {
                let values: Vec<f64> = b.points.iter().filter(|p| p.name == name).map(|p| p.value).collect();
                pre_thinned.insert(name, (thin(&values, (lim.max_points as usize / 2).max(4)), 0));
            }
        }
        let mut dropped_points = 0u64;
        let mut dropped_names: HashSet<&str> = HashSet::new();
        let mut too_long = false;
        for p in &b.points {
            if p.name.len() > lim.max_name_len as usize || p.name.is_empty() {
                too_long |= !p.name.is_empty();
                dropped_points += 1;
                continue;
            }
            if dropped_names.contains(p.name.as_str()) {
                dropped_points += 1;
                continue;
            }
            if !series.contains_key(p.name.as_str()) {
                if have >= lim.max_series as i64 && known.is_none() {
                    known = Some(
                        tx.prepare_cached("SELECT name FROM metric_series WHERE job_id = ?1")?
                            .query_map([job_id], |r| r.get(0))?
                            .collect::<rusqlite::Result<HashSet<String>>>()?,
                    );
                }
                if known.as_ref().is_some_and(|k| !k.contains(&p.name)) {
                    dropped_names.insert(&p.name);
                    dropped_points += 1;
                    continue;
                }
                match load_series(&tx, job_id, &p.name)? {
                    Some(s) => {
                        series.insert(&p.name, s);
                    }
                    None if have >= lim.max_series as i64 => {
                        dropped_names.insert(&p.name);
                        dropped_points += 1;
                        continue;
                    }
                    None => {
                        let goal = Goal::of(&p.name);
                        tx.prepare_cached(
                            "INSERT INTO metric_series (job_id, name, source, goal, last, last_step, last_attempt, \
                             count, stored, next_seq) VALUES (?1, ?2, ?3, ?4, NULL, 0, ?5, 0, 0, 0)",
                        )?
                        .execute(params![
                            job_id,
                            p.name,
                            b.source.as_str(),
                            goal.as_str(),
                            attempt
                        ])?;
                        have += 1;
                        series.insert(
                            &p.name,
                            Series {
                                id: tx.last_insert_rowid(),
                                goal,
                                last: f64::NAN,
                                last_step: 0,
                                last_attempt: attempt,
                                best: None,
                                best_step: None,
                                count: 0,
                                stored: 0,
                                next_seq: 0,
                                dirty: true,
                            },
                        );
                    }
                }
            }
            let s = series.get_mut(p.name.as_str()).expect("inserted above");
            let step = p.step.unwrap_or(s.count);
            let keep = match pre_thinned.get_mut(p.name.as_str()) {
                Some((mask, i)) => {
                    *i += 1;
                    mask[*i - 1]
                }
                None => true,
            };
            if keep {
                tx.prepare_cached(
                    "INSERT INTO metric_points (series_id, seq, attempt, step, at, value) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )?
                .execute(params![s.id, s.next_seq, attempt, step, p.at, stored(p.value)])?;
                s.next_seq += 1;
                s.stored += 1;
            }
            s.count += 1;
            if attempt >= s.last_attempt {
                s.last = p.value;
                s.last_step = step;
                s.last_attempt = attempt;
            }
            if p.value.is_finite() && s.best.is_none_or(|b| s.goal.better(p.value, b)) {
                s.best = Some(p.value);
                s.best_step = Some(step);
            }
            s.dirty = true;
        }
        for s in series.values_mut().filter(|s| s.dirty) {
            if s.stored > lim.max_points as i64 {
                let rows: Vec<(i64, f64)> = tx
                    .prepare_cached("SELECT seq, value FROM metric_points WHERE series_id = ?1 ORDER BY seq")?
                    .query_map([s.id], |r| {
                        Ok((r.get(0)?, r.get::<_, Option<f64>>(1)?.unwrap_or(f64::NAN)))
                    })?
                    .collect::<rusqlite::Result<_>>()?;
                let values: Vec<f64> = rows.iter().map(|r| r.1).collect();
                // Halve what is over, so a thinning happens every max/2 points, not on each.
                let keep = thin(&values, (lim.max_points as usize / 2).max(4));
                let mut del = tx.prepare_cached("DELETE FROM metric_points WHERE series_id = ?1 AND seq = ?2")?;
                for ((seq, _), k) in rows.iter().zip(&keep) {
                    if !k {
                        del.execute(params![s.id, seq])?;
                        s.stored -= 1;
                    }
                }
            }
            tx.prepare_cached(
                "UPDATE metric_series SET last = ?2, last_step = ?3, last_attempt = ?4, best = ?5, best_step = ?6, \
                 count = ?7, stored = ?8, next_seq = ?9 WHERE id = ?1",
            )?
            .execute(params![
                s.id,
                stored(s.last),
                s.last_step,
                s.last_attempt,
                s.best,
                s.best_step,
                s.count,
                s.stored,
                s.next_seq
            ])?;
        }
        for (k, v) in &b.params {
            if k.len() <= lim.max_name_len as usize && !k.is_empty() {
                tx.prepare_cached(
                    "INSERT OR REPLACE INTO job_params (job_id, key, value, source) VALUES (?1, ?2, ?3, ?4)",
                )?
                .execute(params![
                    job_id,
                    k,
                    truncate(v, 4 * lim.max_name_len as usize),
                    b.source.as_str()
                ])?;
            }
        }
        for (k, v) in &b.tags {
            if k.len() <= lim.max_name_len as usize && !k.is_empty() {
                tx.prepare_cached("INSERT OR REPLACE INTO job_tags (job_id, key, value) VALUES (?1, ?2, ?3)")?
                    .execute(params![job_id, k, truncate(v, 20 * lim.max_name_len as usize)])?;
            }
        }
        let mut notes: Vec<String> = b.notes.clone();
        if too_long {
            notes.push(format!(
                "metrics with names longer than {} bytes were not kept (`[results] max_name_len`)",
                lim.max_name_len
            ));
        }
        if !dropped_names.is_empty() {
            notes.push(format!(
                "more than {} distinct metric names: the later ones were not kept (`[results] max_series`)",
                lim.max_series
            ));
        }
        if b.bytes_unread > 0 {
            notes.push(format!(
                "reading stopped after {} of metric files (`[results] max_bytes_per_job`)",
                crate::units::format_bytes(lim.max_bytes)
            ));
        }
        let old: String = tx.query_row("SELECT notes FROM job_ingest WHERE job_id = ?1", [job_id], |r| r.get(0))?;
        let mut all: Vec<String> = serde_json::from_str(&old).unwrap_or_default();
        for n in notes {
            if all.len() < MAX_NOTES && !all.contains(&n) {
                all.push(n);
            }
        }
        // `bytes_limit` holds the most bytes seen left unread in one file once `max_bytes` were read
        // (0: never reached; databases from before this count hold 1 when it was reached).
        tx.prepare_cached(
            "UPDATE job_ingest SET garbage_lines = garbage_lines + ?2, bad_records = bad_records + ?3, \
             bytes_read = bytes_read + ?4, bytes_limit = MAX(bytes_limit, ?5), dropped_points = dropped_points + ?6, \
             dropped_names = dropped_names + ?7, notes = ?8 WHERE job_id = ?1",
        )?
        .execute(params![
            job_id,
            b.garbage_lines as i64,
            b.bad_records as i64,
            b.bytes as i64,
            b.bytes_unread as i64,
            dropped_points as i64,
            dropped_names.len() as i64,
            serde_json::to_string(&all).unwrap_or_else(|_| "[]".into())
        ])?;
        if let Some(c) = &b.cursor {
            tx.prepare_cached("INSERT OR REPLACE INTO metric_cursors (job_id, attempt, key, offset, lines) VALUES (?1, ?2, ?3, ?4, ?5)")?
                .execute(params![job_id, attempt, c.key, c.offset as i64, c.lines as i64])?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Benchmarks: metric `name` for each of `ids` (one point at step 0, value `value(id)`), in one
    /// transaction with prepared statements, as ingestion would leave it (100k runs in seconds).
    #[doc(hidden)]
    pub fn seed_metric(&mut self, ids: &[i64], name: &str, value: impl Fn(i64) -> f64) -> Result<()> {
        let tx = self.conn.transaction()?;
        {
            let goal = Goal::of(name);
            let mut series = tx.prepare(
                "INSERT INTO metric_series (job_id, name, source, goal, last, last_step, last_attempt, best, \
                 best_step, count, stored, next_seq) VALUES (?1, ?2, 'file', ?3, ?4, 0, 1, ?4, 0, 1, 1, 1)",
            )?;
            let mut point = tx.prepare(
                "INSERT INTO metric_points (series_id, seq, attempt, step, at, value) VALUES (?1, 0, 1, 0, 0, ?2)",
            )?;
            for &id in ids {
                let v = value(id);
                series.execute(params![id, name, goal.as_str(), v])?;
                point.execute(params![tx.last_insert_rowid(), v])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// A job's results: its series (at most `max_points` points each; `None`: all stored), params
    /// (the `matrix` values that made it, then what it logged), tags and the ingest report.
    /// When the job last reported a checkpoint since `since` (its attempt's start): the time of its
    /// latest `checkpoint` metrics point (`{"checkpoint": 1}` in `GANTRY_METRICS`, or a TensorBoard /
    /// MLflow scalar of that name). Thinning always keeps a series' last point, so this is exact.
    pub fn last_checkpoint(&self, job_id: i64, since: i64) -> Result<Option<i64>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT MAX(p.at) FROM metric_points p JOIN metric_series s ON s.id = p.series_id \
                 WHERE s.job_id = ?1 AND s.name = 'checkpoint' AND p.at >= ?2",
            )?
            .query_row(params![job_id, since], |r| r.get::<_, Option<i64>>(0))?)
    }

    pub fn job_results(&self, job_id: i64, max_points: Option<u32>) -> Result<JobResults> {
        let mut metrics = vec![];
        let rows: Vec<(i64, MetricSeries)> = self
            .conn
            .prepare_cached(
                "SELECT id, name, source, goal, last, last_step, best, best_step, count FROM metric_series \
                 WHERE job_id = ?1 ORDER BY name",
            )?
            .query_map([job_id], |r| {
                Ok((
                    r.get(0)?,
                    MetricSeries {
                        name: r.get(1)?,
                        source: MetricSource::parse(&r.get::<_, String>(2)?).unwrap_or(MetricSource::File),
                        goal: if r.get::<_, String>(3)? == "min" {
                            Goal::Min
                        } else {
                            Goal::Max
                        },
                        last: Num(r.get::<_, Option<f64>>(4)?.unwrap_or(f64::NAN)),
                        last_step: r.get(5)?,
                        best: r.get::<_, Option<f64>>(6)?.map(Num),
                        best_step: r.get(7)?,
                        count: r.get::<_, i64>(8)? as u64,
                        points: vec![],
                    },
                ))
            })?
            .collect::<rusqlite::Result<_>>()?;
        for (id, mut s) in rows {
            if max_points != Some(0) {
                let pts: Vec<MetricPoint> = self
                    .conn
                    .prepare_cached(
                        "SELECT step, at, value, attempt FROM metric_points WHERE series_id = ?1 ORDER BY seq",
                    )?
                    .query_map([id], |r| {
                        Ok(MetricPoint {
                            step: r.get(0)?,
                            at: r.get(1)?,
                            value: Num(r.get::<_, Option<f64>>(2)?.unwrap_or(f64::NAN)),
                            attempt: r.get(3)?,
                        })
                    })?
                    .collect::<rusqlite::Result<_>>()?;
                s.points = match max_points {
                    Some(m) if pts.len() > m as usize => {
                        let values: Vec<f64> = pts.iter().map(|p| p.value.0).collect();
                        let keep = thin(&values, m as usize);
                        pts.into_iter().zip(keep).filter(|(_, k)| *k).map(|(p, _)| p).collect()
                    }
                    _ => pts,
                };
            }
            metrics.push(s);
        }
        let (mut params, mut param_sources) = (BTreeMap::new(), BTreeMap::new());
        if let Some(j) = self.job(job_id)? {
            for (k, v) in j.job.matrix_part.map(|m| m.params).unwrap_or_default() {
                params.insert(k.clone(), v);
                param_sources.insert(k, MetricSource::Matrix);
            }
        }
        let logged: Vec<(String, String, String)> = self
            .conn
            .prepare_cached("SELECT key, value, source FROM job_params WHERE job_id = ?1 ORDER BY key")?
            .query_map([job_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<rusqlite::Result<_>>()?;
        for (k, v, src) in logged {
            if let std::collections::btree_map::Entry::Vacant(slot) = params.entry(k.clone()) {
                slot.insert(v);
                param_sources.insert(k, MetricSource::parse(&src).unwrap_or(MetricSource::Mlflow));
            }
        }
        let tags: BTreeMap<String, String> = self
            .conn
            .prepare_cached("SELECT key, value FROM job_tags WHERE job_id = ?1")?
            .query_map([job_id], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(JobResults {
            job_id,
            metrics,
            params,
            param_sources,
            tags,
            ingest: self.ingest_report(job_id)?,
        })
    }

    fn ingest_report(&self, job_id: i64) -> Result<IngestReport> {
        let r = self
            .conn
            .prepare_cached(
                "SELECT garbage_lines, bad_records, bytes_read, bytes_limit, dropped_points, dropped_names, notes \
                 FROM job_ingest WHERE job_id = ?1",
            )?
            .query_row([job_id], |r| {
                Ok(IngestReport {
                    garbage_lines: r.get::<_, i64>(0)? as u64,
                    bad_records: r.get::<_, i64>(1)? as u64,
                    bytes_read: r.get::<_, i64>(2)? as u64,
                    bytes_limit_reached: r.get::<_, i64>(3)? > 0,
                    bytes_unread: r.get::<_, i64>(3)? as u64,
                    dropped_points: r.get::<_, i64>(4)? as u64,
                    dropped_names: r.get::<_, i64>(5)? as u64,
                    notes: serde_json::from_str(&r.get::<_, String>(6)?).unwrap_or_default(),
                })
            })
            .optional()?;
        Ok(r.unwrap_or_default())
    }

    /// Each job's series summaries (by name) and params (matrix first, then logged): what a
    /// comparison shows of each run.
    pub fn results_summaries(&self, job_ids: &[i64]) -> Result<HashMap<i64, RunResults>> {
        let mut out: HashMap<i64, RunResults> = HashMap::new();
        let mut series = self
            .conn
            .prepare_cached("SELECT name, goal, last, best FROM metric_series WHERE job_id = ?1 ORDER BY name")?;
        let mut params = self
            .conn
            .prepare_cached("SELECT key, value FROM job_params WHERE job_id = ?1")?;
        let mut spec = self.conn.prepare_cached("SELECT spec_json FROM jobs WHERE id = ?1")?;
        for &id in job_ids {
            let s: Vec<SeriesSummary> = series
                .query_map([id], |r| {
                    Ok(SeriesSummary {
                        name: r.get(0)?,
                        goal: if r.get::<_, String>(1)? == "min" {
                            Goal::Min
                        } else {
                            Goal::Max
                        },
                        last: r.get::<_, Option<f64>>(2)?.unwrap_or(f64::NAN),
                        best: r.get(3)?,
                    })
                })?
                .collect::<rusqlite::Result<_>>()?;
            let mut p: BTreeMap<String, String> = BTreeMap::new();
            let text: Option<String> = spec.query_row([id], |r| r.get(0)).optional()?;
            if let Some(m) = text
                .and_then(|t| serde_json::from_str::<crate::spec::ValidJob>(&t).ok())
                .and_then(|j| j.matrix_part)
            {
                p.extend(m.params);
            }
            for kv in params.query_map([id], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))? {
                let (k, v) = kv?;
                p.entry(k).or_insert(v);
            }
            out.insert(id, (s, p));
        }
        Ok(out)
    }

    /// The last value of metric `name` of each of `job_ids` that logged it.
    pub fn last_metric(&self, job_ids: &[i64], name: &str) -> Result<HashMap<i64, f64>> {
        let mut q = self
            .conn
            .prepare_cached("SELECT last FROM metric_series WHERE job_id = ?1 AND name = ?2")?;
        let mut out = HashMap::new();
        for &id in job_ids {
            if let Some(v) = q
                .query_row(params![id, name], |r| r.get::<_, Option<f64>>(0))
                .optional()?
            {
                out.insert(id, v.unwrap_or(f64::NAN));
            }
        }
        Ok(out)
    }
}

/// A run's row in a comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct CompareRun {
    pub id: i64,
    pub name: String,
    pub owner: String,
    pub owner_uid: u32,
    pub state: crate::protocol::JobState,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub attempts: u32,
    /// GPUs held × milliseconds, all attempts (an open one up to `now`).
    pub gpu_ms: i64,
}

impl Store {
    /// Ids of the runs named `name` or of its sweep (`name[...]`), oldest first, at most `limit`.
    pub fn job_ids_named(&self, name: &str, limit: usize) -> Result<Vec<i64>> {
        let ids = self
            .conn
            .prepare_cached(
                "SELECT id FROM jobs WHERE name = ?1 OR (name >= ?1 || '[' AND name < ?1 || '\\') ORDER BY id LIMIT ?2",
            )?
            .query_map(params![name, limit as i64], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(ids)
    }

    /// The rows of `ids` (in that order; unknown ids left out) with their GPU time.
    pub fn compare_runs(&self, ids: &[i64], now: i64) -> Result<Vec<CompareRun>> {
        let mut q = self.conn.prepare_cached(
            "SELECT j.id, j.name, j.owner, j.owner_uid, j.state, j.started_at, j.finished_at, j.attempts, \
             (SELECT COALESCE(SUM(json_array_length(a.gpus) * MAX(COALESCE(a.ended_at, ?2) - a.started_at, 0)), 0) \
              FROM attempts a WHERE a.job_id = j.id) \
             FROM jobs j WHERE j.id = ?1",
        )?;
        let mut out = vec![];
        for &id in ids {
            let row = q
                .query_row(params![id, now], |r| {
                    Ok(CompareRun {
                        id: r.get(0)?,
                        name: r.get(1)?,
                        owner: r.get(2)?,
                        owner_uid: r.get(3)?,
                        state: crate::protocol::JobState::parse(&r.get::<_, String>(4)?)
                            .unwrap_or(crate::protocol::JobState::Failed),
                        started_at: r.get(5)?,
                        finished_at: r.get(6)?,
                        attempts: r.get(7)?,
                        gpu_ms: r.get(8)?,
                    })
                })
                .optional()?;
            out.extend(row);
        }
        Ok(out)
    }
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{validate_text, Format, Origin};

    fn store_with_job() -> (Store, i64) {
        let mut s = Store::open_in_memory().unwrap();
        let j = validate_text("image: a\ncommand: x\n", Format::Yaml, &Origin::default()).unwrap();
        let owner = super::super::Owner {
            uid: 1000,
            gid: 1000,
            name: "ada".into(),
        };
        let id = s.insert_job(&j, &owner, "test", None, |_, _| None).unwrap();
        (s, id)
    }

    fn pts(name: &str, vals: &[f64]) -> Vec<Logged> {
        vals.iter()
            .enumerate()
            .map(|(i, v)| Logged {
                name: name.into(),
                step: Some(i as i64 * 10),
                at: 1000 + i as i64,
                value: *v,
            })
            .collect()
    }

    #[test]
    fn last_and_best_follow_the_goal_and_keep_nan_as_nan() {
        let (mut s, id) = store_with_job();
        let mut b = ResultsBatch::new(MetricSource::File);
        b.points = pts("val/loss", &[1.0, 0.5, 0.7, f64::NAN]);
        b.points.extend(pts("acc", &[0.1, 0.9, 0.8]));
        b.points.extend(pts("reward", &[f64::NAN, f64::INFINITY]));
        s.add_results(id, 1, &b, &ResultsLimits::default()).unwrap();
        let r = s.job_results(id, None).unwrap();
        let by = |n: &str| r.metrics.iter().find(|m| m.name == n).unwrap().clone();
        let loss = by("val/loss");
        assert!(loss.last.0.is_nan());
        assert_eq!(
            (loss.best, loss.best_step, loss.goal),
            (Some(Num(0.5)), Some(10), Goal::Min)
        );
        assert!(loss.points[3].value.0.is_nan());
        let acc = by("acc");
        assert_eq!((acc.last, acc.best, acc.goal), (Num(0.8), Some(Num(0.9)), Goal::Max));
        let reward = by("reward");
        assert_eq!((reward.last, reward.best), (Num(f64::INFINITY), None));
        // A second attempt goes on where the first left off.
        let mut b = ResultsBatch::new(MetricSource::File);
        b.points = vec![Logged {
            name: "acc".into(),
            step: None,
            at: 5000,
            value: 0.95,
        }];
        s.add_results(id, 2, &b, &ResultsLimits::default()).unwrap();
        let acc = s
            .job_results(id, None)
            .unwrap()
            .metrics
            .into_iter()
            .find(|m| m.name == "acc")
            .unwrap();
        assert_eq!((acc.last, acc.last_step, acc.count), (Num(0.95), 3, 4));
        assert_eq!(acc.points.last().unwrap().attempt, 2);
    }

    /// Issue 32 item 3: a preemption victim's last checkpoint is its latest `checkpoint` point of
    /// the running attempt (one from an earlier attempt, before `since`, does not count), even when
    /// the series was thinned.
    #[test]
    fn the_last_checkpoint_is_the_latest_checkpoint_point_of_this_attempt() {
        let (mut s, id) = store_with_job();
        assert_eq!(s.last_checkpoint(id, 0).unwrap(), None);
        let lim = ResultsLimits {
            max_points: 10,
            ..Default::default()
        };
        let mut b = ResultsBatch::new(MetricSource::File);
        b.points = pts("checkpoint", &[1.0; 50]);
        b.points.extend(pts("loss", &[0.5]));
        s.add_results(id, 1, &b, &lim).unwrap();
        assert_eq!(s.last_checkpoint(id, 0).unwrap(), Some(1049));
        assert_eq!(
            s.last_checkpoint(id, 1050).unwrap(),
            None,
            "none in an attempt started later"
        );
    }

    /// A flood of one name in one read (a 4 MiB chunk of `{"loss": 1}` lines is 350k points) writes
    /// about what the series keeps, not a row per point (each then deleted by the thinning).
    #[test]
    fn a_batch_flooding_one_name_is_thinned_before_the_database_and_still_counted() {
        let (mut s, id) = store_with_job();
        let lim = ResultsLimits {
            max_points: 100,
            ..Default::default()
        };
        let mut vals: Vec<f64> = (0..20_000).map(|i| (i as f64 * 0.01).cos()).collect();
        vals[12_345] = -7.0;
        let mut b = ResultsBatch::new(MetricSource::File);
        b.points = pts("loss", &vals);
        let before = s.conn.total_changes();
        s.add_results(id, 1, &b, &lim).unwrap();
        let written = s.conn.total_changes() - before;
        assert!(written < 200, "{written} rows written for 20,000 points of one name");
        let x = s.job_results(id, None).unwrap().metrics.remove(0);
        assert_eq!((x.count, x.best, x.last_step), (20_000, Some(Num(-7.0)), 199_990));
        let v: Vec<f64> = x.points.iter().map(|p| p.value.0).collect();
        assert!(v.contains(&-7.0) && v.len() <= 100, "{}", v.len());
        assert_eq!((v[0], *v.last().unwrap()), (vals[0], vals[19_999]));
    }

    #[test]
    fn a_long_series_is_thinned_keeping_first_last_lowest_and_highest() {
        let (mut s, id) = store_with_job();
        let lim = ResultsLimits {
            max_points: 100,
            ..Default::default()
        };
        let mut vals: Vec<f64> = (0..1000).map(|i| (i as f64 * 0.37).sin()).collect();
        vals[333] = -5.0;
        vals[777] = 9.0;
        for chunk in vals.chunks(50) {
            let mut b = ResultsBatch::new(MetricSource::File);
            b.points = pts("x", chunk);
            s.add_results(id, 1, &b, &lim).unwrap();
        }
        let x = s.job_results(id, None).unwrap().metrics.remove(0);
        assert_eq!(x.count, 1000);
        assert!(x.points.len() <= 100 && x.points.len() >= 25, "{}", x.points.len());
        let v: Vec<f64> = x.points.iter().map(|p| p.value.0).collect();
        assert!(v.contains(&-5.0) && v.contains(&9.0));
        assert_eq!((v[0], *v.last().unwrap()), (vals[0], vals[999]));
        let few = s.job_results(id, Some(10)).unwrap().metrics.remove(0);
        assert!(few.points.len() <= 10, "{}", few.points.len());
        assert!(few.points.iter().any(|p| p.value.0 == 9.0));
        assert!(s.job_results(id, Some(0)).unwrap().metrics[0].points.is_empty());
    }

    #[test]
    fn names_beyond_the_bounds_are_counted_not_kept() {
        let (mut s, id) = store_with_job();
        let lim = ResultsLimits {
            max_series: 3,
            max_name_len: 8,
            ..Default::default()
        };
        let mut b = ResultsBatch::new(MetricSource::File);
        for i in 0..10 {
            b.points.extend(pts(&format!("m{i}"), &[1.0, 2.0]));
        }
        b.points.extend(pts("a_very_long_name", &[1.0]));
        b.garbage_lines = 2;
        s.add_results(id, 1, &b, &lim).unwrap();
        let r = s.job_results(id, Some(0)).unwrap();
        assert_eq!(r.metrics.len(), 3);
        assert_eq!((r.ingest.dropped_names, r.ingest.dropped_points), (7, 15));
        assert_eq!(r.ingest.garbage_lines, 2);
        assert_eq!(r.ingest.notes.len(), 2, "{:?}", r.ingest.notes);
    }
}
