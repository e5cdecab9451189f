//! Where a container that Docker lists as `created` really is, for recovery (issue 18, item 14).
//!
//! Docker's list says `created` until a start in flight has finished, and by then the job's process
//! may already run: an engine killed inside `docker start` leaves exactly that. An inspect is
//! answered only once a start in flight has finished (Docker holds the container's lock for the
//! whole start), and tells whether the container ever began (`State.StartedAt`, `Pid`). A container
//! created moments ago that never began is inspected again once [`START_SETTLE`] has passed since
//! its creation: a start sent just before the crash may not have reached Docker's lock yet.

use std::time::{Duration, SystemTime};

use bollard::errors::Error as DockerError;
use bollard::models::ContainerState;
use bollard::query_parameters as qp;

use super::{classify, DockerExecutor, ExecError, Life};
use crate::defaults::START_SETTLE;

/// A container's start, settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Created, and no start ever gave it a process.
    NeverStarted,
    /// Started, running (or paused, restarting).
    Running,
    /// Started, and ended.
    Ended,
}

impl From<Settled> for Life {
    fn from(s: Settled) -> Life {
        match s {
            Settled::NeverStarted => Life::Created,
            Settled::Running => Life::Running,
            Settled::Ended => Life::Exited,
        }
    }
}

/// What an inspected state says; `Err(wait)`: never began but created less than [`START_SETTLE`]
/// ago (by `now`), so look again after `wait`.
pub(super) fn settled(st: &ContainerState, created: Option<&str>, now: SystemTime) -> Result<Settled, Duration> {
    if st.running.unwrap_or(false) || st.restarting.unwrap_or(false) || st.paused.unwrap_or(false) {
        return Ok(Settled::Running);
    }
    // Docker's zero time (`0001-01-01T00:00:00Z`) until the first start; the pid is 0 when not running.
    let began = st.pid.is_some_and(|p| p > 0)
        || st
            .started_at
            .as_deref()
            .is_some_and(|t| !t.is_empty() && !t.starts_with("0001-"));
    if began {
        return Ok(Settled::Ended);
    }
    let age = created
        .and_then(|c| humantime::parse_rfc3339_weak(c).ok())
        .and_then(|c| now.duration_since(c).ok());
    match age {
        Some(age) if age < START_SETTLE => Err(START_SETTLE - age),
        // Old enough, or its creation time unreadable (or in the future: the clock moved): decided now.
        _ => Ok(Settled::NeverStarted),
    }
}

/// [`super::Executor::settle`] for Docker.
pub(super) async fn settle(x: &DockerExecutor, id: &str) -> Result<Option<Settled>, ExecError> {
    let mut waited = false;
    loop {
        let info = match x
            .docker
            .inspect_container(id, None::<qp::InspectContainerOptions>)
            .await
        {
            Ok(info) => info,
            Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => return Ok(None),
            Err(e) => return Err(classify(e)),
        };
        match settled(
            &info.state.unwrap_or_default(),
            info.created.as_deref(),
            SystemTime::now(),
        ) {
            Ok(s) => return Ok(Some(s)),
            Err(_) if waited => return Ok(Some(Settled::NeverStarted)),
            Err(wait) => {
                tokio::time::sleep(wait).await;
                waited = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_listed_as_created_is_judged_by_its_inspected_start() {
        let now = humantime::parse_rfc3339("2026-12-01T12:00:10Z").unwrap();
        let zero = Some("0001-01-01T00:00:00Z".to_string());
        let st = |running: bool, pid: i64, started_at: Option<String>| ContainerState {
            running: Some(running),
            pid: Some(pid),
            started_at,
            ..Default::default()
        };
        let long_ago = Some("2026-12-01T11:00:00.123456789Z");
        // (what, state, created, decision)
        #[allow(clippy::type_complexity)] // a table test: one tuple per case reads as the table
        let rows: Vec<(&str, ContainerState, Option<&str>, Result<Settled, Duration>)> = vec![
            (
                "its start finished, the job runs",
                st(true, 4242, Some("2026-12-01T12:00:09.5Z".into())),
                long_ago,
                Ok(Settled::Running),
            ),
            (
                "began and ended (a start that went through while no engine ran)",
                st(false, 0, Some("2026-12-01T12:00:09.5Z".into())),
                long_ago,
                Ok(Settled::Ended),
            ),
            (
                "a process, whatever the time says",
                st(false, 4242, zero.clone()),
                long_ago,
                Ok(Settled::Ended),
            ),
            (
                "paused counts as running",
                ContainerState {
                    paused: Some(true),
                    ..st(false, 0, zero.clone())
                },
                long_ago,
                Ok(Settled::Running),
            ),
            (
                "never began, created long ago",
                st(false, 0, zero.clone()),
                long_ago,
                Ok(Settled::NeverStarted),
            ),
            (
                "never began, created 2 s ago: look again in 3 s",
                st(false, 0, zero.clone()),
                Some("2026-12-01T12:00:08Z"),
                Err(Duration::from_secs(3)),
            ),
            (
                "never began, created 5 s ago",
                st(false, 0, zero.clone()),
                Some("2026-12-01T12:00:05Z"),
                Ok(Settled::NeverStarted),
            ),
            (
                "never began, no start time at all",
                st(false, 0, None),
                long_ago,
                Ok(Settled::NeverStarted),
            ),
            (
                "never began, creation time unreadable",
                st(false, 0, zero.clone()),
                Some("yesterday"),
                Ok(Settled::NeverStarted),
            ),
        ];
        for (what, state, created, want) in rows {
            assert_eq!(settled(&state, created, now), want, "{what}");
        }
    }
}
