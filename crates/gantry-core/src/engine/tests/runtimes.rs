//! Declared runtimes: a lie backfilled, then preempted or waited for, and overrunning users planned
//! by what their runs took.

use super::*;

/// Four simulated GPUs, reservations after 10 s, preemption on (the overdue rule, min_run 30 min:
/// long enough that only the overrun rule can preempt within these tests).
fn four_gpus(dir: &std::path::Path, preemption: bool) -> Config {
    let mut c = cfg(dir);
    c.gpus = Some("sim:4x24GiB".into());
    c.lab.policy.reserve_after = Duration::from_secs(10);
    c.lab.policy.preemption.enabled = preemption;
    c.lab.policy.preemption.rules = crate::scheduler::PreemptRules {
        overdue: true,
        priority_gap: None,
        fair_share: false,
        min_run_ms: 1_800_000,
        max_per_day: 3,
    };
    c
}

fn reason_of(e: &Engine, id: i64) -> String {
    e.queue()
        .unwrap()
        .iter()
        .find(|x| x.job.id == id)
        .and_then(|x| x.reason.clone())
        .unwrap_or_default()
}

/// alice's three 1-GPU jobs (2 min, declared) hold GPUs 0-2 and her 4-GPU job waits until GPUs 0-3
/// are reserved for it; then bob's job declaring `expected_runtime: 1s` is backfilled on GPU 3.
/// Returns (wide, bob's job).
async fn a_lie_is_backfilled(e: &Engine, bobs_spec: &str) -> (i64, i64) {
    for i in 0..3 {
        let id = submit(e, &format!("name: short{i}\nimage: a\ngpus: 1\nexpected_runtime: 2m\n"));
        wait_state(e, id, |s| s == JobState::Running).await;
    }
    let wide = submit(e, "name: wide\nimage: a\ngpus: 4\nexpected_runtime: 1m\n");
    for _ in 0..100_000 {
        if reason_of(e, wide).contains("are reserved for it") {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        reason_of(e, wide).contains("GPUs 0,1,2,3 are reserved for it"),
        "{}",
        reason_of(e, wide)
    );
    let liar = e.submit(file(bobs_spec, &bob())).unwrap()[0];
    wait_state(e, liar, |s| s == JobState::Running).await;
    assert_eq!(
        e.job_detail(wide).unwrap().job.state,
        JobState::Queued,
        "bob's job was backfilled on its 1 s promise"
    );
    (wide, liar)
}

/// Issue 18 item 7: bob's 1 s promise on a long job, preemptible: once it ran past it (by the 30 s
/// margin) while the reserved job waits for its GPU, it is preempted for it, whatever `min_run`.
#[tokio::test(start_paused = true)]
async fn a_preemptible_job_that_overran_its_declared_runtime_is_preempted_for_the_reservation() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    for i in 0..3 {
        fake.script(
            &format!("short{i}"),
            Script {
                runtime: Duration::from_secs(120),
                ..Default::default()
            },
        );
    }
    fake.script(
        "wide",
        Script {
            runtime: Duration::from_secs(60),
            ..Default::default()
        },
    );
    fake.script(
        "liar",
        Script {
            runtime: Duration::from_secs(3600),
            checkpoint: Some(Duration::from_secs(1)),
            ..Default::default()
        },
    );
    let (e, _h) = start_with(four_gpus(dir.path(), true), &fake);
    let (wide, liar) = a_lie_is_backfilled(&e, "name: liar\nimage: a\ngpus: 1\nexpected_runtime: 1s\npreemptible: true\ncheckpoint: {signal: SIGUSR1, grace: 30s}\n").await;
    assert_eq!(final_state(&e, wide).await, JobState::Succeeded);
    let w = e.job_detail(wide).unwrap();
    let l = e.job_detail(liar).unwrap();
    assert_eq!(l.attempts[0].reason, Some(EndReason::Preempted), "{:?}", l.attempts);
    let msg = l.attempts[0].message.clone().unwrap_or_default();
    assert!(
        msg.starts_with(&format!("preempted by job {wide} (job {liar} ran "))
            && msg.contains("s past its declared 1s runtime, on GPUs reserved for alice's 4-GPU job)"),
        "{msg}"
    );
    // Cut off at its broken promise, not at min_run (30 min) or its own end (1 h).
    let waited = w.attempts[0].started_at - w.job.submitted_at;
    assert!(waited < 300_000, "the reserved job waited {waited} ms");
    assert!(
        w.attempts[0].started_at >= l.attempts[0].ended_at.unwrap(),
        "it ran beside the job preempted for it"
    );
    // bob's overrun is counted: his declarations give way to what his runs took from now on.
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(e.stats.lock().unwrap().overruns.get("bob"), Some(&1));
    assert_eq!(
        e.stats.lock().unwrap().overruns.get("alice"),
        None,
        "alice kept her promises"
    );
}

/// Issue 18 item 7: the same lie on a job that is not preemptible: it is not stopped (an estimate is
/// not a limit), and the reserved job says whom it waits for and why.
#[tokio::test(start_paused = true)]
async fn a_job_that_overran_and_is_not_preemptible_runs_on_and_the_reserved_job_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    for i in 0..3 {
        fake.script(
            &format!("short{i}"),
            Script {
                runtime: Duration::from_secs(120),
                ..Default::default()
            },
        );
    }
    fake.script(
        "wide",
        Script {
            runtime: Duration::from_secs(60),
            ..Default::default()
        },
    );
    fake.script(
        "liar",
        Script {
            runtime: Duration::from_secs(400),
            ..Default::default()
        },
    );
    let (e, _h) = start_with(four_gpus(dir.path(), true), &fake);
    let (wide, liar) = a_lie_is_backfilled(&e, "name: liar\nimage: a\ngpus: 1\nexpected_runtime: 1s\n").await;
    let want = format!("waits for job {liar}, which ran ");
    for _ in 0..100_000 {
        if reason_of(&e, wide).contains(&want) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let why = reason_of(&e, wide);
    assert!(why.contains(&want) && why.ends_with("s past its declared 1s runtime (not preemptible, so it runs to its end; no job is backfilled on its promise any more)"), "{why}");
    assert_eq!(final_state(&e, liar).await, JobState::Succeeded);
    assert_eq!(final_state(&e, wide).await, JobState::Succeeded);
    let l = e.job_detail(liar).unwrap();
    assert_eq!(l.attempts.len(), 1, "never stopped");
    assert!(e.job_detail(wide).unwrap().attempts[0].started_at >= l.attempts[0].ended_at.unwrap());
    assert!(fake.signals.lock().unwrap().is_empty());
}

/// Issue 18 item 7: bob's 8 jobs declared 1 s and ran 53 s each. His next 1 s declaration counts as
/// what those runs took (their p80, 53 s), so it is not backfilled on GPUs reserved for a job that
/// can start in less than that.
#[tokio::test(start_paused = true)]
async fn a_user_who_overran_declarations_is_planned_by_what_their_runs_took() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    fake.script(
        "liar",
        Script {
            runtime: Duration::from_secs(53),
            ..Default::default()
        },
    );
    for i in 0..3 {
        fake.script(
            &format!("short{i}"),
            Script {
                runtime: Duration::from_secs(120),
                ..Default::default()
            },
        );
    }
    fake.script(
        "wide",
        Script {
            runtime: Duration::from_secs(60),
            ..Default::default()
        },
    );
    let (e, _h) = start_with(four_gpus(dir.path(), false), &fake);
    let spec = "name: liar\nimage: a\ngpus: 1\nexpected_runtime: 1s\n";
    let past: Vec<i64> = (0..8).map(|_| e.submit(file(spec, &bob())).unwrap()[0]).collect();
    for id in &past {
        assert_eq!(final_state(&e, *id).await, JobState::Succeeded);
    }
    tokio::time::sleep(Duration::from_secs(31)).await; // the stats refresh with the next pass that has work
    for i in 0..3 {
        let id = submit(
            &e,
            &format!("name: short{i}\nimage: a\ngpus: 1\nexpected_runtime: 2m\n"),
        );
        wait_state(&e, id, |s| s == JobState::Running).await;
    }
    assert_eq!(e.stats.lock().unwrap().overruns.get("bob"), Some(&8));
    let wide = submit(&e, "name: wide\nimage: a\ngpus: 4\nexpected_runtime: 1m\n");
    for _ in 0..100_000 {
        if reason_of(&e, wide).contains("are reserved for it") {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // The reserved GPUs free in under a minute: 53 s does not fit (1 s would have).
    tokio::time::sleep(Duration::from_secs(15)).await;
    let next = e.submit(file(spec, &bob())).unwrap()[0];
    assert_eq!(final_state(&e, wide).await, JobState::Succeeded);
    assert_eq!(final_state(&e, next).await, JobState::Succeeded);
    let w = e.job_detail(wide).unwrap();
    let n = e.job_detail(next).unwrap();
    assert!(
        n.attempts[0].started_at >= w.attempts[0].ended_at.unwrap(),
        "bob's job was backfilled on his 1 s declaration again: {:?} / {:?}",
        n.attempts,
        w.attempts
    );
}
