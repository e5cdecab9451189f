//! Runs side by side (`gantry compare`, the app's Compare view): one row per run, params and each
//! metric's last value, best first. Reads only the per-series summaries. Another user's run is a
//! row without params or metrics (owner and admins only, like logs).

use std::collections::{BTreeMap, BTreeSet};

use super::super::{Engine, EngineError};
use crate::defaults::COMPARE_MAX_RUNS;
use crate::protocol::{CompareMetric, CompareQuery, CompareRow, Comparison, Goal, Num};
use crate::store::SeriesSummary;

/// The ids of `gantry compare 12,13,15`.
fn parse_ids(text: &str) -> Result<Vec<i64>, EngineError> {
    let mut ids = vec![];
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.parse::<i64>() {
            Ok(id) if id > 0 => {
                if !ids.contains(&id) {
                    ids.push(id)
                }
            }
            _ => {
                return Err(EngineError::BadQuery(format!(
                "{part:?} is not a job id: give ids (`gantry compare 12 13 15`) or one name (`gantry compare sweep`)"
            )))
            }
        }
    }
    Ok(ids)
}

/// Sort key of a row: with the metric first, better first; NaN and missing last.
fn order(goal: Goal, v: Option<f64>) -> (u8, f64) {
    match v {
        Some(v) if !v.is_nan() => (
            0,
            match goal {
                Goal::Min => v,
                Goal::Max => -v,
            },
        ),
        Some(_) => (1, 0.0),
        None => (2, 0.0),
    }
}

impl Engine {
    /// Runs of `q` (ids, or a name: a sweep's `name[...]` runs or every run of that name) as
    /// `caller` may see them, best first by `q.sort`.
    pub fn compare(&self, caller: u32, q: &CompareQuery) -> Result<Comparison, EngineError> {
        let ids = match (&q.ids, &q.name) {
            (Some(ids), _) if !ids.trim().is_empty() => parse_ids(ids)?,
            (_, Some(name)) if !name.trim().is_empty() => self.reader().job_ids_named(name, COMPARE_MAX_RUNS + 1)?,
            _ => {
                return Err(EngineError::BadQuery(
                    "nothing to compare: give job ids (`gantry compare 12 13 15`) or a name (`gantry compare sweep`)"
                        .into(),
                ))
            }
        };
        if ids.is_empty() {
            return Err(EngineError::BadQuery(format!(
                "no run is named {:?} or is one of the sweep `{}[...]`: `gantry history --text NAME` finds names",
                q.name.as_deref().unwrap_or(""),
                q.name.as_deref().unwrap_or("")
            )));
        }
        if ids.len() > COMPARE_MAX_RUNS {
            return Err(EngineError::BadQuery(format!(
                "{} runs to compare, more than the {COMPARE_MAX_RUNS} one table shows: give ids, or a sweep's name",
                if q.ids.is_some() {
                    ids.len().to_string()
                } else {
                    "more than that".into()
                }
            )));
        }
        let now = self.now();
        let st = self.reader();
        let runs = st.compare_runs(&ids, now)?;
        if let Some(missing) = ids.iter().find(|id| !runs.iter().any(|r| r.id == **id)) {
            return Err(EngineError::NoSuchJob(*missing));
        }
        let policy = self.policy();
        let visible: Vec<i64> = runs
            .iter()
            .filter(|r| policy.may_see_private(caller, r.owner_uid))
            .map(|r| r.id)
            .collect();
        let mut summaries = st.results_summaries(&visible)?;
        drop(st);
        let mut metrics: BTreeMap<String, Goal> = BTreeMap::new();
        let mut rows = vec![];
        for r in runs {
            let (series, params) = summaries.remove(&r.id).unwrap_or_default();
            let hidden = !visible.contains(&r.id);
            let (mut last, mut best) = (BTreeMap::new(), BTreeMap::new());
            for SeriesSummary {
                name,
                goal,
                last: l,
                best: b,
            } in series
            {
                metrics.entry(name.clone()).or_insert(goal);
                last.insert(name.clone(), Num(l));
                if let Some(b) = b {
                    best.insert(name, Num(b));
                }
            }
            rows.push(CompareRow {
                job_id: r.id,
                name: r.name,
                owner: r.owner,
                state: r.state,
                started_at: r.started_at,
                finished_at: r.finished_at,
                duration_ms: r.started_at.map(|s| (r.finished_at.unwrap_or(now) - s).max(0)),
                gpu_hours: r.gpu_ms as f64 / 3_600_000.0,
                attempts: r.attempts,
                hidden,
                params,
                last,
                best,
            });
        }
        let params: BTreeSet<&String> = rows.iter().flat_map(|r| r.params.keys()).collect();
        let differing: Vec<String> = params
            .iter()
            .filter(|k| {
                let shown: BTreeSet<Option<&String>> =
                    rows.iter().filter(|r| !r.hidden).map(|r| r.params.get(**k)).collect();
                shown.len() > 1
            })
            .map(|k| k.to_string())
            .collect();
        let params: Vec<String> = params.into_iter().cloned().collect();
        let sort = match &q.sort {
            Some(m) if !m.is_empty() => {
                if !metrics.contains_key(m) && !metrics.is_empty() {
                    return Err(EngineError::BadQuery(format!(
                        "none of these runs logged a metric named {m:?}; they logged: {}",
                        metrics.keys().cloned().collect::<Vec<_>>().join(", ")
                    )));
                }
                Some(m.clone())
            }
            // The first metric every shown run has, else the first of any.
            _ => metrics
                .keys()
                .find(|m| rows.iter().filter(|r| !r.hidden).all(|r| r.last.contains_key(*m)))
                .or_else(|| metrics.keys().next())
                .cloned(),
        };
        let sort = sort.map(|name| CompareMetric {
            goal: if q.min == Some(true) {
                Goal::Min
            } else {
                metrics.get(&name).copied().unwrap_or_else(|| Goal::of(&name))
            },
            name,
        });
        if let Some(s) = &sort {
            rows.sort_by(|a, b| {
                let ka = order(s.goal, a.last.get(&s.name).map(|n| n.0));
                let kb = order(s.goal, b.last.get(&s.name).map(|n| n.0));
                ka.0.cmp(&kb.0)
                    .then(ka.1.total_cmp(&kb.1))
                    .then(a.job_id.cmp(&b.job_id))
            });
        }
        Ok(Comparison {
            rows,
            params,
            differing,
            metrics: metrics
                .into_iter()
                .map(|(name, goal)| CompareMetric { name, goal })
                .collect(),
            sort,
        })
    }

    /// The last value of metric `name` of each of `job_ids` (those that logged it).
    pub fn last_metric(&self, job_ids: &[i64], name: &str) -> Result<std::collections::HashMap<i64, f64>, EngineError> {
        Ok(self.reader().last_metric(job_ids, name)?)
    }

    /// A job's results (the caller's right to see them is the API's to check).
    pub fn job_results(&self, id: i64, max_points: Option<u32>) -> Result<crate::protocol::JobResults, EngineError> {
        Ok(self.reader().job_results(id, max_points)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked_and_rows_sort_best_first_with_nan_and_missing_last() {
        assert_eq!(parse_ids("3, 1,3,,2").unwrap(), vec![3, 1, 2]);
        assert!(parse_ids("3,x")
            .unwrap_err()
            .to_string()
            .contains("\"x\" is not a job id"));
        let mut v = [Some(0.5), None, Some(f64::NAN), Some(0.1), Some(0.9)];
        v.sort_by(|a, b| {
            let (x, y) = (order(Goal::Min, *a), order(Goal::Min, *b));
            x.0.cmp(&y.0).then(x.1.total_cmp(&y.1))
        });
        assert_eq!(v[..3], [Some(0.1), Some(0.5), Some(0.9)]);
        assert!(v[3].unwrap().is_nan() && v[4].is_none());
        assert!(order(Goal::Max, Some(0.9)) < order(Goal::Max, Some(0.5)));
    }
}
