//! Every route of the engine's API, written once: `api::router` mounts these patterns, and
//! `client::Client` fills them in ([`fill`]) and adds its query string ([`with_query`]).
//! A `{name}` segment is a path parameter (axum's syntax).

use std::fmt::Display;

use serde::Serialize;

/// `GET`: [`super::StatusInfo`].
pub const STATUS: &str = "/v1/status";
/// `GET`: [`super::WhoAmI`], the caller as the engine sees them (peer credentials).
pub const WHOAMI: &str = "/v1/whoami";
/// `GET`: the queue, [`super::QueueEntryView`]s; `POST` a [`super::SubmitRequest`]: [`super::Submitted`].
pub const JOBS: &str = "/v1/jobs";
/// `GET` with [`super::QueuePageQuery`]: [`super::QueuePage`], the part of the queue `gantry ls` shows.
pub const QUEUE_PAGE: &str = "/v1/queue";
/// `GET`: [`super::JobDetailView`].
pub const JOB: &str = "/v1/jobs/{id}";
/// `POST`: the state the job was in ([`super::JobState`]).
pub const CANCEL: &str = "/v1/jobs/{id}/cancel";
/// `POST` a [`super::PriorityRequest`]: whether the job was queued (and so changed).
pub const PRIORITY: &str = "/v1/jobs/{id}/priority";
/// `POST`: `true` when the job was queued and not held yet.
pub const HOLD: &str = "/v1/jobs/{id}/hold";
/// `POST`: `true` when the job was held.
pub const RELEASE: &str = "/v1/jobs/{id}/release";
/// `POST`: [`super::Submitted`], the copy of the job's spec queued again.
pub const RERUN: &str = "/v1/jobs/{id}/rerun";
/// `GET` with [`super::LogQuery`]: the job's output (streamed until the job ends with `follow`).
pub const LOGS: &str = "/v1/jobs/{id}/logs";
/// `GET` with `Upgrade: gantry-terminal/1`: the session's terminal, framed as [`super::terminal`] says
/// (owner only).
pub const ATTACH: &str = "/v1/jobs/{id}/attach";
/// `POST` a [`super::terminal::OpenRequest`]: [`super::terminal::Opened`], a loopback URL reaching one
/// of the job's `ports` (owner only).
pub const OPEN: &str = "/v1/jobs/{id}/open";
/// `POST` a [`super::SubmitRequest`]: the [`crate::spec::ValidJob`] it would queue, nothing queued.
pub const VALIDATE: &str = "/v1/validate";
/// `POST` a [`super::SubmitRequest`]: [`super::SubmitPreview`], a dry run of `POST` [`JOBS`] as the
/// caller (every check, and where and when it would start), nothing queued.
pub const PREVIEW: &str = "/v1/jobs/preview";
/// `GET`: [`super::GpuStatus`].
pub const GPUS: &str = "/v1/gpus";
/// `GET` with [`super::Since`]: the last hour's [`super::RecentSample`]s.
pub const GPUS_RECENT: &str = "/v1/gpus/recent";
/// `GET` with [`super::Range`]: one GPU's [`super::GpuMinute`]s.
pub const GPU_MINUTES: &str = "/v1/gpus/{index}/minutes";
/// `GET` with [`super::HistoryFilter`]: [`super::HistoryRow`]s.
pub const HISTORY: &str = "/v1/history";
/// `GET` with [`super::HistoryFilter`] (its page ignored): how many runs match.
pub const HISTORY_COUNT: &str = "/v1/history/count";
/// `GET` with [`super::Range`]: [`super::TimelineRun`]s.
pub const TIMELINE: &str = "/v1/timeline";
/// `GET` with [`super::UsageQuery`]: [`super::UsageReport`].
pub const USAGE: &str = "/v1/usage";
/// `GET`: the caller's [`super::InboxInfo`]; `POST`: watch the drop folder the caller just made.
pub const INBOX: &str = "/v1/inbox";
/// `GET`: [`super::EngineEvent`]s as newline-delimited JSON, for as long as the connection stays.
pub const EVENTS: &str = "/v1/events";

/// `GET`: the caller's [`super::Subscription`]s (and the lab's webhooks); `POST` a [`super::NotifyAdd`]: the new [`super::Subscription`].
pub const NOTIFY: &str = "/v1/notify";
/// `POST`: remove one of the caller's subscriptions; `true` when it existed.
pub const NOTIFY_REMOVE: &str = "/v1/notify/{id}/remove";
/// `POST`: a test notification to each of the caller's subscriptions: their [`super::NotifyDelivery`]s.
pub const NOTIFY_TEST: &str = "/v1/notify/test";
/// `GET` with [`super::NotifyLogQuery`]: the caller's [`super::NotifyDelivery`]s, newest first.
pub const NOTIFY_LOG: &str = "/v1/notify/log";
/// `GET`: `gantry usage --csv`'s GPU-hours per user per day and GPU utilization by hour of day ([`super::UsageCharts`]).
pub const USAGE_CHARTS: &str = "/v1/usage/charts";

/// `GET` with [`super::BookingsQuery`]: [`super::Bookings`]; `POST` a [`super::BookRequest`]: the new [`super::BookingView`].
pub const BOOKINGS: &str = "/v1/bookings";
/// `GET` with [`super::ResultsQuery`]: [`super::JobResults`], the job's metrics, params and tags (owner
/// and admins only, like logs).
pub const RESULTS: &str = "/v1/jobs/{id}/results";
/// `GET` with [`super::CompareQuery`]: [`super::Comparison`], runs side by side, best first.
pub const COMPARE: &str = "/v1/compare";

/// `POST`: cancel a booking (its owner or root): the [`super::BookingView`] as it is now.
pub const BOOKING_CANCEL: &str = "/v1/bookings/{id}/cancel";

/// `pattern` with its one `{…}` parameter replaced by `value`: `fill(JOB, 7)` is `/v1/jobs/7`.
pub fn fill(pattern: &str, value: impl Display) -> String {
    match (pattern.find('{'), pattern.find('}')) {
        (Some(open), Some(close)) if open < close => format!("{}{value}{}", &pattern[..open], &pattern[close + 1..]),
        _ => pattern.to_string(),
    }
}

/// `path?query`, the query string from a struct's fields (absent `Option`s left out).
pub fn with_query<Q: Serialize>(path: &str, query: &Q) -> Result<String, serde_urlencoded::ser::Error> {
    let q = serde_urlencoded::to_string(query)?;
    Ok(if q.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{q}")
    })
}

/// A query string (`a=1&b=x`, no `?`) as its struct, parsed as the router parses it.
pub fn parse_query<Q: serde::de::DeserializeOwned>(query: &str) -> Result<Q, serde_urlencoded::de::Error> {
    serde_urlencoded::from_str(query)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{HistoryFilter, JobState, LogQuery, Range};

    #[test]
    fn a_route_is_filled_and_queried_the_way_the_router_reads_it() {
        assert_eq!(fill(JOB, 7), "/v1/jobs/7");
        assert_eq!(fill(GPU_MINUTES, 2), "/v1/gpus/2/minutes");
        assert_eq!(fill(STATUS, 1), STATUS);
        assert_eq!(
            with_query(TIMELINE, &Range { from: 1, to: 2 }).unwrap(),
            "/v1/timeline?from=1&to=2"
        );
        assert_eq!(
            with_query(&fill(LOGS, 3), &LogQuery { follow: true }).unwrap(),
            "/v1/jobs/3/logs?follow=true"
        );
        let f = HistoryFilter {
            user: Some("a b&c".into()),
            status: Some(JobState::TimedOut),
            limit: Some(50),
            ..Default::default()
        };
        let q = with_query(HISTORY, &f).unwrap();
        assert_eq!(q, "/v1/history?user=a+b%26c&status=timed_out&limit=50");
        let back: HistoryFilter = parse_query(q.split_once('?').unwrap().1).unwrap();
        assert_eq!(
            (back.user.as_deref(), back.status, back.limit, back.since),
            (Some("a b&c"), Some(JobState::TimedOut), Some(50), None)
        );
        assert_eq!(with_query(HISTORY, &HistoryFilter::default()).unwrap(), HISTORY);
    }
}
