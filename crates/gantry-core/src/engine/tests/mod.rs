//! The engine's tests, in-process against the fake executor under `tokio::time::pause` (real SQLite
//! in a temp dir; Docker is covered by tests/): the helpers they share, then one file per theme.

use std::sync::Arc;
use std::time::Duration;

use super::submit::{Spec, Submission};
use super::{Config, Engine, Paths, RunOn};
use crate::clock::TokioClock;
use crate::executor::fake::{FakeExecutor, Script};
use crate::store::{EndReason, JobState, Owner};

mod bookings;
mod lifecycle;
mod preemption;
mod queue;
mod runtimes;
mod submit;

fn cfg(dir: &std::path::Path) -> Config {
    let mut c = Config::new(Paths::in_dir(dir.join("state"), dir.join("inbox")));
    c.gpus = Some("sim:1x24GiB".into());
    c.lab.policy.retry_backoff = Duration::from_secs(1);
    c.lab.policy.stop_grace = Duration::from_secs(1);
    c
}

fn alice() -> Owner {
    Owner {
        uid: 1000,
        gid: 1000,
        name: "alice".into(),
    }
}

/// A spec file's text, submitted by `owner` as the API does.
fn file<'a>(yaml: &'a str, owner: &'a Owner) -> Submission<'a> {
    Submission {
        spec: Spec::File {
            text: yaml,
            file_name: "test.yaml",
            base_dir: None,
            begin: None,
        },
        owner,
        source: "test".into(),
        source_key: None,
        idempotency_key: None,
    }
}

fn submit(e: &Engine, yaml: &str) -> i64 {
    e.submit(file(yaml, &alice())).unwrap()[0]
}

async fn wait_state(e: &Engine, id: i64, want: impl Fn(JobState) -> bool) -> JobState {
    for _ in 0..100_000 {
        let s = e.job_detail(id).unwrap().job.state;
        if want(s) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("job {id} never reached the state");
}

async fn final_state(e: &Engine, id: i64) -> JobState {
    wait_state(e, id, |s| s.is_final()).await
}

/// An engine on the fake executor whose clock is tokio's (paused in most tests, so its "now" moves
/// exactly with the timers).
fn start(dir: &std::path::Path, fake: &Arc<FakeExecutor>) -> (Arc<Engine>, tokio::task::JoinHandle<()>) {
    let e = Engine::open_on(cfg(dir), RunOn::Docker(fake.clone()), Arc::new(TokioClock::new())).unwrap();
    let h = tokio::spawn({
        let e = e.clone();
        async move { e.run().await.unwrap() }
    });
    (e, h)
}

/// An engine on one simulated GPU with preemption on (the priority rule, min_run 10 min).
fn preempting(dir: &std::path::Path) -> Config {
    let mut c = cfg(dir);
    c.lab.policy.preemption.enabled = true;
    c.lab.policy.preemption.rules = crate::scheduler::PreemptRules {
        overdue: false,
        priority_gap: Some(10),
        fair_share: false,
        min_run_ms: 600_000,
        max_per_day: 3,
    };
    c
}

fn start_with(c: Config, fake: &Arc<FakeExecutor>) -> (Arc<Engine>, tokio::task::JoinHandle<()>) {
    let e = Engine::open_on(c, RunOn::Docker(fake.clone()), Arc::new(TokioClock::new())).unwrap();
    let h = tokio::spawn({
        let e = e.clone();
        async move { e.run().await.unwrap() }
    });
    (e, h)
}

fn bob() -> Owner {
    Owner {
        uid: 1001,
        gid: 1001,
        name: "bob".into(),
    }
}
