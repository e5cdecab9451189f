//! The read-only routes over what ran and the GPUs: history, results and compared runs, the
//! timeline, usage and efficiency, GPU status and samples.

use std::collections::HashMap;

use axum::extract::{ConnectInfo, Path as UrlPath, Query, State};
use axum::Json;

use crate::engine::EngineError;
use crate::protocol::{
    GpuMinute, GpuStatus, HistoryFilter, HistoryRow, Range, RecentSample, Since, TimelineRun, UsageQuery, UsageReport,
};
use crate::protocol::{UsageCharts, UsageChartsQuery};

use super::{Failure, Peer, Res, E};

pub(super) async fn gpus(State(e): E) -> Json<GpuStatus> {
    Json(e.gpu_status())
}

pub(super) async fn history(
    State(e): E,
    ConnectInfo(p): ConnectInfo<Peer>,
    Query(f): Query<HistoryFilter>,
) -> Res<Vec<HistoryRow>> {
    let mut rows = e.history(&f)?;
    // `--metric M`: its last value on the caller's own runs (everyone's for admins), like logs.
    if let Some(m) = f.metric.as_deref().filter(|m| !m.is_empty()) {
        let policy = e.policy();
        let mut uids: HashMap<&str, u32> = HashMap::new();
        let ids: Vec<i64> = rows
            .iter()
            .filter(|r| {
                let owner = *uids.entry(r.owner.as_str()).or_insert_with(|| uid_of(&r.owner));
                policy.may_see_private(p.uid, owner)
            })
            .map(|r| r.id)
            .collect();
        let last = e.last_metric(&ids, m)?;
        for r in &mut rows {
            r.metric = last.get(&r.id).copied().map(crate::protocol::Num);
        }
    }
    Ok(Json(rows))
}

/// A user's uid by name (`u32::MAX`, nobody's, when unknown).
fn uid_of(name: &str) -> u32 {
    nix::unistd::User::from_name(name)
        .ok()
        .flatten()
        .map_or(u32::MAX, |u| u.uid.as_raw())
}

/// A job's metrics, params and tags: its owner and admins only, like its output.
pub(super) async fn results(
    State(e): E,
    ConnectInfo(p): ConnectInfo<Peer>,
    UrlPath(id): UrlPath<i64>,
    Query(q): Query<crate::protocol::ResultsQuery>,
) -> Res<crate::protocol::JobResults> {
    let job = e.job_detail(id)?.job;
    if !e.policy().may_see_private(p.uid, job.owner_uid) {
        return Err(Failure::forbidden(format!(
            "job {id} belongs to {}; only its owner or an admin can read its results",
            job.owner
        )));
    }
    let r = tokio::task::spawn_blocking(move || e.job_results(id, q.max_points))
        .await
        .map_err(|err| EngineError::Fatal(format!("reading results crashed: {err}")))??;
    Ok(Json(r))
}

/// Runs side by side; another user's runs show without params or metrics.
pub(super) async fn compare(
    State(e): E,
    ConnectInfo(p): ConnectInfo<Peer>,
    Query(q): Query<crate::protocol::CompareQuery>,
) -> Res<crate::protocol::Comparison> {
    let r = tokio::task::spawn_blocking(move || e.compare(p.uid, &q))
        .await
        .map_err(|err| EngineError::Fatal(format!("comparing crashed: {err}")))??;
    Ok(Json(r))
}

pub(super) async fn history_count(State(e): E, Query(f): Query<HistoryFilter>) -> Res<i64> {
    Ok(Json(e.history_count(&f)?))
}

pub(super) async fn timeline(State(e): E, Query(r): Query<Range>) -> Res<Vec<TimelineRun>> {
    Ok(Json(e.timeline(r.from, r.to)?))
}

/// Per-user GPU-hours, jobs, mean wait and fair-share usage: everyone may see them (they are the
/// numbers fair share orders the queue by).
pub(super) async fn usage(State(e): E, Query(q): Query<UsageQuery>) -> Res<UsageReport> {
    Ok(Json(e.usage(q.since_ms)?))
}

/// GPU-hours per user per day and GPU utilization by hour of day since `since_ms` (public, like `usage`).
pub(super) async fn usage_charts(State(e): E, Query(q): Query<UsageChartsQuery>) -> Res<UsageCharts> {
    let r = tokio::task::spawn_blocking(move || e.usage_charts(q.since_ms, q.bucket_ms, q.tz_offset_min))
        .await
        .map_err(|err| EngineError::Fatal(format!("usage charts crashed: {err}")))??;
    Ok(Json(r))
}

/// Per user GPU-hours held vs used and CPU efficiency, and the machine's per day (public, like
/// `usage`: sums per user, no job's figures).
pub(super) async fn usage_efficiency(
    State(e): E,
    Query(q): Query<crate::protocol::EfficiencyQuery>,
) -> Res<crate::protocol::EfficiencyReport> {
    let r = tokio::task::spawn_blocking(move || e.usage_efficiency(q.since_ms, q.tz_offset_min))
        .await
        .map_err(|err| EngineError::Fatal(format!("usage efficiency crashed: {err}")))??;
    Ok(Json(r))
}

/// 1 Hz samples of the last hour: `[ms, [[util, mem_used], ...]]`.
pub(super) async fn gpus_recent(State(e): E, Query(q): Query<Since>) -> Json<Vec<RecentSample>> {
    Json(
        e.recent_samples(q.since)
            .into_iter()
            .map(|(at, gpus)| RecentSample(at, gpus))
            .collect(),
    )
}

pub(super) async fn gpu_minutes(
    State(e): E,
    UrlPath(index): UrlPath<u32>,
    Query(r): Query<Range>,
) -> Res<Vec<GpuMinute>> {
    Ok(Json(
        e.gpu_minutes(index, r.from, r.to)?
            .into_iter()
            .map(|(at, util, mem)| GpuMinute(at, util, mem))
            .collect(),
    ))
}
