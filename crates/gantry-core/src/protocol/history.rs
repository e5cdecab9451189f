//! Finished runs, the GPU timeline and usage, and the query strings that ask for them.

use serde::{Deserialize, Serialize};
use ts_rs::TS;

use super::job::{EndReason, JobState};

/// `GET /v1/history` and `/v1/history/count`: which finished runs, in what order, which page.
#[derive(Debug, Clone, Default, Serialize, Deserialize, TS)]
#[ts(rename = "HistoryQuery", optional_fields)]
pub struct HistoryFilter {
    pub user: Option<String>,
    pub status: Option<JobState>,
    /// Finished at or after (ms).
    pub since: Option<i64>,
    pub limit: Option<u32>,
    pub offset: Option<u32>,
    /// Substring of name or image.
    pub text: Option<String>,
    /// Image name (exact).
    pub image: Option<String>,
    /// Finished before (ms).
    pub until: Option<i64>,
    /// Sort key: finished (default), started, duration, gpu_hours, name, owner, exit_code, id.
    pub sort: Option<String>,
    /// Ascending instead of descending.
    pub asc: Option<bool>,
    /// A metric whose last value each row carries (`gantry history --metric M`): the caller's own
    /// runs only (every run for admins).
    pub metric: Option<String>,
}

/// A run on the GPU timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct TimelineRun {
    pub job_id: i64,
    pub name: String,
    pub owner: String,
    pub gpus: Vec<u32>,
    pub start: i64,
    pub end: Option<i64>,
    pub reason: Option<EndReason>,
}

/// One completed run for `history`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct HistoryRow {
    pub id: i64,
    pub name: String,
    pub owner: String,
    pub image: String,
    pub status: JobState,
    pub exit_code: Option<i64>,
    pub gpus: Vec<u32>,
    pub gpu_uuids: Vec<String>,
    pub submitted_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub attempts: u32,
    /// The last value of the asked [`HistoryFilter::metric`]; absent when not asked, not logged, or
    /// another user's run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable, as = "Option<super::results::NumTs>")]
    pub metric: Option<super::results::Num>,
}

/// One user's figures in `gantry usage`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct UserUsage {
    pub user: String,
    /// GPU count x run time of attempts, clipped to the window.
    pub gpu_hours: f64,
    /// Jobs that ended in the window (as `gantry history --since` lists them).
    pub jobs_finished: u64,
    /// Mean time from submit to first start of jobs first started in the window.
    pub mean_wait_ms: Option<i64>,
    /// Decayed GPU-hours now: what fair share orders equal-priority jobs by (lighter users first).
    pub fair_share_usage: f64,
    /// GPU-hours of attempts that ended by preemption in the window (part of `gpu_hours`): at most
    /// what preemption cost the user (the work since their last checkpoint is the real loss).
    #[serde(default)]
    pub gpu_hours_preempted: f64,
}

/// `gantry usage`: per user, over [since_ms, until_ms).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct UsageReport {
    pub since_ms: i64,
    pub until_ms: i64,
    pub fair_share_half_life_ms: i64,
    pub users: Vec<UserUsage>,
}

/// `?from=&to=` (ms) of `GET /v1/timeline` and `/v1/gpus/{index}/minutes`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Range {
    pub from: i64,
    pub to: i64,
}

/// `?since=` (ms) of `GET /v1/gpus/recent`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Since {
    #[serde(default)]
    pub since: i64,
}

/// `?since_ms=` of `GET /v1/usage`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct UsageQuery {
    pub since_ms: i64,
}

/// `?since_ms=&bucket_ms=&tz_offset_min=` of `GET /v1/usage/charts`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct UsageChartsQuery {
    pub since_ms: i64,
    /// The width of one bar: an hour for the last 24 h, a day for 7 or 30 days.
    pub bucket_ms: i64,
    /// The viewer's time zone (minutes east of UTC), so days and hours of day are theirs.
    #[serde(default)]
    pub tz_offset_min: i32,
}

/// GPU-hours of one user in one bucket (`gantry usage --csv`, the Usage view's stacked chart).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct UsageBucket {
    /// Start of the bucket (ms since the epoch; a local midnight or hour in the asked time zone).
    pub start: i64,
    pub user: String,
    pub gpu_hours: f64,
}

/// Mean GPU utilization (all GPUs, %) in one hour of one day: the heat map's cells.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct UtilCell {
    /// The local day's start (ms since the epoch).
    pub day: i64,
    /// 0 to 23, local.
    pub hour: u32,
    pub utilization: f64,
}

/// `GET /v1/usage/charts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
pub struct UsageCharts {
    pub since_ms: i64,
    pub until_ms: i64,
    pub bucket_ms: i64,
    pub buckets: Vec<UsageBucket>,
    pub heat: Vec<UtilCell>,
}

/// `?follow=` of `GET /v1/jobs/{id}/logs`: keep streaming until the job has ended.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct LogQuery {
    #[serde(default)]
    pub follow: bool,
}
