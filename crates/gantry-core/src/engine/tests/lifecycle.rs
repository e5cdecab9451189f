//! The engine's retry, timeout, cancel, recovery and crash handling; users' bounds, job ids, output
//! and retention; the start-up line.

use super::*;

#[tokio::test(start_paused = true)]
async fn failures_retry_with_backoff_then_fail() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    fake.script(
        "flaky",
        Script {
            code: 3,
            ..Default::default()
        },
    );
    let (e, _h) = start(dir.path(), &fake);
    let id = submit(&e, "name: flaky\nimage: a\nretries: 2\n");
    assert_eq!(final_state(&e, id).await, JobState::Failed);
    let d = e.job_detail(id).unwrap();
    assert_eq!(d.attempts.len(), 3, "1 run + 2 retries");
    assert!(d.attempts.iter().all(|a| a.exit_code == Some(3)));
    // Backoff doubles: attempt 3 starts at least 1 s + 2 s after attempt 1 ended (plus attempt 2's
    // own 1 s run), on the engine's clock, which follows paused time.
    let gap = d.attempts[2].started_at - d.attempts[0].ended_at.unwrap();
    assert!(
        gap >= 3_000,
        "attempt 3 started {gap} ms after attempt 1 ended; backoff is 1 s, then 2 s"
    );
    assert_eq!(fake.live(), 0, "every container is removed once its end is recorded");
}

#[tokio::test(start_paused = true)]
async fn timeout_stops_the_job_and_cancel_stops_another() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    fake.script(
        "long",
        Script {
            runtime: Duration::from_secs(3600),
            ..Default::default()
        },
    );
    let (e, _h) = start(dir.path(), &fake);
    let t = submit(&e, "name: long\nimage: a\ntimeout: 5s\nretries: 3\ngpus: 0\n");
    let c = submit(&e, "name: long\nimage: a\ngpus: 0\n");
    wait_state(&e, c, |s| s == JobState::Running).await;
    e.cancel(c, 1000).unwrap();
    assert_eq!(final_state(&e, c).await, JobState::Cancelled);
    assert_eq!(final_state(&e, t).await, JobState::TimedOut);
    let d = e.job_detail(t).unwrap();
    assert_eq!(d.attempts.len(), 1, "a timeout is never retried");
    assert_eq!(d.attempts[0].reason, Some(EndReason::Timeout));
    assert_eq!(
        e.cancel(t, 1001).unwrap_err().to_string(),
        format!("job {t} belongs to alice; only its owner or root may change it")
    );
}

#[tokio::test(start_paused = true)]
async fn a_restarted_engine_reattaches_and_never_runs_a_job_twice() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    fake.script(
        "train",
        Script {
            runtime: Duration::from_secs(60),
            ..Default::default()
        },
    );
    let (e, h) = start(dir.path(), &fake);
    let id = submit(&e, "name: train\nimage: a\n");
    wait_state(&e, id, |s| s == JobState::Running).await;
    e.shutdown();
    h.await.unwrap();
    drop(e);
    let (e2, _h2) = start(dir.path(), &fake);
    assert_eq!(final_state(&e2, id).await, JobState::Succeeded);
    assert_eq!(e2.job_detail(id).unwrap().attempts.len(), 1);
    assert_eq!(
        fake.started.lock().unwrap().len(),
        1,
        "started once: {:?}",
        fake.started.lock().unwrap()
    );
}

#[tokio::test(start_paused = true)]
async fn a_crashed_supervisor_frees_its_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    fake.script(
        "buggy",
        Script {
            runtime: Duration::from_secs(60),
            panic_on_wait: true,
            ..Default::default()
        },
    );
    let (e, _h) = start(dir.path(), &fake);
    let bad = submit(&e, "name: buggy\nimage: a\ngpus: 1\n");
    let next = submit(&e, "name: next\nimage: a\ngpus: 1\n");
    assert_eq!(final_state(&e, bad).await, JobState::Failed);
    let d = e.job_detail(bad).unwrap();
    assert_eq!(d.attempts[0].reason, Some(EndReason::EngineError));
    assert_eq!(
        final_state(&e, next).await,
        JobState::Succeeded,
        "the only GPU was released"
    );
}

#[tokio::test(start_paused = true)]
async fn docker_away_during_a_run_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    fake.script(
        "train",
        Script {
            runtime: Duration::from_secs(20),
            ..Default::default()
        },
    );
    let (e, _h) = start(dir.path(), &fake);
    let id = submit(&e, "name: train\nimage: a\n");
    wait_state(&e, id, |s| s == JobState::Running).await;
    fake.down.store(true, std::sync::atomic::Ordering::SeqCst);
    let queued = submit(&e, "name: other\nimage: a\ngpus: 0\n");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let q = e.queue().unwrap();
    let w = q.iter().find(|x| x.job.id == queued).unwrap();
    assert!(
        w.reason
            .as_deref()
            .unwrap_or("")
            .contains("Docker engine is not reachable"),
        "{:?}",
        w.reason
    );
    fake.down.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(final_state(&e, id).await, JobState::Succeeded);
    assert_eq!(final_state(&e, queued).await, JobState::Succeeded);
    assert_eq!(e.job_detail(id).unwrap().attempts.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn priority_and_queue_length_are_bounded_for_users() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    let mut c = cfg(dir.path());
    c.lab.policy.max_queued_per_user = 3;
    let e = Engine::open_with(c, fake.clone()).unwrap();
    let err = e
        .submit(file("image: a\npriority: 2147483647\n", &alice()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("outside the range you may use (-10..10)"), "{err}");
    let root = Owner {
        uid: 0,
        gid: 0,
        name: "root".into(),
    };
    assert!(
        e.submit(file("image: a\npriority: 100\n", &root)).is_ok(),
        "admins may go further"
    );
    // The engine is not running: jobs stay queued.
    for _ in 0..3 {
        e.submit(file("image: a\n", &alice())).unwrap();
    }
    let err = e.submit(file("image: a\n", &alice())).unwrap_err().to_string();
    assert!(err.contains("limit of 3 queued jobs per user"), "{err}");
    assert!(
        e.submit(file(
            "image: a\n",
            &Owner {
                uid: 1001,
                gid: 1001,
                name: "bob".into()
            }
        ))
        .is_ok(),
        "bob is not affected"
    );
    let id = e.queue().unwrap()[1].job.id;
    assert!(e
        .set_priority(id, 11, 1000)
        .unwrap_err()
        .to_string()
        .contains("-10..10"));
    assert!(e.set_priority(id, 10, 1000).unwrap());
}

#[test]
fn job_ids_never_restart_after_a_lost_wal() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _g = rt.enter();
    let fake = FakeExecutor::new();
    let first = {
        let e = Engine::open_with(cfg(dir.path()), fake.clone()).unwrap();
        (0..5).map(|_| submit(&e, "image: a\n")).next_back().unwrap()
    };
    // Lose the database entirely (the worst case of a cut WAL): ids continue after the last one.
    for f in ["gantry.db", "gantry.db-wal", "gantry.db-shm"] {
        let _ = std::fs::remove_file(dir.path().join("state").join(f));
    }
    let e = Engine::open_with(cfg(dir.path()), fake.clone()).unwrap();
    let next = submit(&e, "image: a\n");
    assert!(next > first, "id {next} reused (last was {first})");
}

#[test]
fn users_read_job_output_without_the_engines_resume_timestamps() {
    let stored = b"[gantry 2026-11-30T12:54:09.003Z] attempt 1 of job 2 on GPU 0\n\
2026-11-30T12:54:09.235313034Z epoch 1 loss 0.5\n\
2026-11-30T12:54:09.300000000Z 2026-01-01 is the date the job printed\n\
2026-11-30T12:54:09.400000000Z \n\
[gantry] log truncated: the job wrote more than 10 bytes\n";
    let shown = String::from_utf8(super::super::strip_stamps(stored)).unwrap();
    assert_eq!(
        shown,
        "[gantry 2026-11-30T12:54:09.003Z] attempt 1 of job 2 on GPU 0\nepoch 1 loss 0.5\n2026-01-01 is the date the job printed\n\n[gantry] log truncated: the job wrote more than 10 bytes\n"
    );
}

#[tokio::test(start_paused = true)]
async fn retention_deletes_old_logs_then_old_jobs_and_never_waiting_or_running_ones() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    fake.script(
        "long",
        Script {
            runtime: Duration::from_secs(3600),
            ..Default::default()
        },
    );
    let mut c = cfg(dir.path());
    c.lab.policy.log_keep = Some(Duration::from_secs(3600));
    c.lab.policy.history_keep = Some(Duration::from_secs(7200));
    let e = Engine::open_with(c, fake.clone()).unwrap();
    tokio::spawn({
        let e = e.clone();
        async move { e.run().await.unwrap() }
    });
    let done = submit(&e, "image: a\ngpus: 0\n");
    assert_eq!(final_state(&e, done).await, JobState::Succeeded);
    let running = submit(&e, "name: long\nimage: a\ngpus: 1\n");
    wait_state(&e, running, |s| s == JobState::Running).await;
    let held = submit(&e, "image: a\ngpus: 1\n"); // waits for the one GPU
    assert!(e.hold(held, true, 1000).unwrap());
    std::fs::write(e.log_of(done), "output\n").unwrap();
    let now = crate::store::now_ms();
    // Table: (time of the prune, (jobs, log files) deleted, the finished job's log and row still there).
    for (at, deleted, log, row) in [
        (now, (0, 0), true, true),
        (now + 5_400_000, (0, 1), false, true),
        (now + 10_800_000, (1, 0), false, false),
    ] {
        assert_eq!(e.prune(at).unwrap(), deleted, "prune at +{}s", (at - now) / 1000);
        assert_eq!(
            (e.log_of(done).exists(), e.job_detail(done).is_ok()),
            (log, row),
            "at +{}s",
            (at - now) / 1000
        );
    }
    assert_eq!(e.job_detail(running).unwrap().job.state, JobState::Running);
    assert_eq!(e.job_detail(held).unwrap().job.state, JobState::Queued);
}

/// A pass whose inputs did not change plans nothing, except when the clock matters: a retry's
/// backoff ending must start it on time (not at the next full pass, 10 s later).
#[tokio::test]
async fn a_retry_starts_when_its_backoff_ends_though_nothing_else_changes() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    fake.script(
        "flaky",
        Script {
            code: 3,
            ..Default::default()
        },
    );
    let (e, _h) = start(dir.path(), &fake);
    let id = submit(&e, "name: flaky\nimage: a\nretries: 1\n");
    assert_eq!(final_state(&e, id).await, JobState::Failed);
    let d = e.job_detail(id).unwrap();
    assert_eq!(d.attempts.len(), 2);
    let gap = d.attempts[1].started_at - d.attempts[0].ended_at.unwrap();
    assert!(
        (1000..4000).contains(&gap),
        "the retry started {gap} ms after the failure; the backoff is 1 s"
    );
}

#[test]
fn the_start_up_line_says_1_cpu_not_1_cpus() {
    use crate::scheduler::CpuRam;
    const G: u64 = 1 << 30;
    let line = super::super::for_jobs_line(
        CpuRam {
            cpus_milli: 1000,
            memory: 3 * G,
        },
        CpuRam {
            cpus_milli: 2000,
            memory: 4 * G,
        },
    );
    assert!(
        line.starts_with("CPU and RAM for jobs: 1 CPU, 3.0 GiB (the machine's 2 CPUs and 4.0 GiB,"),
        "{line}"
    );
    let line = super::super::for_jobs_line(
        CpuRam {
            cpus_milli: 500,
            memory: G,
        },
        CpuRam {
            cpus_milli: 1000,
            memory: 2 * G,
        },
    );
    assert!(
        line.starts_with("CPU and RAM for jobs: 0.5 CPUs, 1.0 GiB (the machine's 1 CPU and 2.0 GiB,"),
        "{line}"
    );
}
