//! Preemption: the signal, grace and resume, jobs that are not preemptible, an engine killed
//! mid-preemption, one victim per GPU, a Docker restart.

use super::*;

fn env_of(fake: &FakeExecutor, name: &str) -> Vec<Vec<String>> {
    fake.envs
        .lock()
        .unwrap()
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, e)| e.clone())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_preempted_job_gets_its_signal_and_grace_then_resumes_at_its_place_with_retries_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    // `train` runs 1 h, saves for 20 s on its signal; `urgent` runs 1 min.
    fake.script(
        "train",
        Script {
            runtime: Duration::from_secs(3600),
            checkpoint: Some(Duration::from_secs(20)),
            ..Default::default()
        },
    );
    fake.script(
        "urgent",
        Script {
            runtime: Duration::from_secs(60),
            ..Default::default()
        },
    );
    let (e, _h) = start_with(preempting(dir.path()), &fake);
    let root = Owner {
        uid: 0,
        gid: 0,
        name: "root".into(),
    };
    // alice hears of her job's preemption (issue 20's outbox): a target of hers for that event.
    let hook = crate::protocol::notify::NotifyTarget::Webhook {
        url: "http://hooks.example/p".into(),
    };
    e.store()
        .notify_subscribe(
            1000,
            "alice",
            &hook,
            &[crate::protocol::notify::NotifyEvent::Preempted],
            None,
            10,
        )
        .unwrap()
        .unwrap();
    let train = submit(
        &e,
        "name: train\nimage: a\npreemptible: true\nretries: 0\ncheckpoint: {signal: SIGUSR1, grace: 2m}\n",
    );
    wait_state(&e, train, |s| s == JobState::Running).await;
    // A job later in the queue behind the preempted one, and the high-priority one.
    let later = submit(&e, "name: later\nimage: a\n");
    let urgent = e.submit(file("name: urgent\nimage: a\npriority: 10\n", &root)).unwrap()[0];
    // Not before min_run (10 min): nothing is signalled yet.
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert!(fake.signals.lock().unwrap().is_empty(), "preempted before min_run");
    assert_eq!(e.job_detail(urgent).unwrap().job.state, JobState::Queued);
    // While the urgent job runs, the preempted one says why it waits.
    wait_state(&e, urgent, |s| s == JobState::Running).await;
    let q = e.queue().unwrap();
    let why = q
        .iter()
        .find(|x| x.job.id == train)
        .and_then(|x| x.reason.clone())
        .unwrap_or_default();
    assert!(
        why.starts_with(&format!("preempted by job {urgent} (root's 1-GPU job"))
            && why.ends_with("· resumes when GPUs free"),
        "{why}"
    );
    assert_eq!(final_state(&e, urgent).await, JobState::Succeeded);
    // The spec's signal and grace were used.
    let sent: Vec<(String, Duration)> = fake
        .signals
        .lock()
        .unwrap()
        .iter()
        .map(|s| (s.1.clone(), s.2))
        .collect();
    assert_eq!(sent, vec![("SIGUSR1".to_string(), Duration::from_secs(120))]);
    assert_eq!(final_state(&e, train).await, JobState::Succeeded);
    let d = e.job_detail(train).unwrap();
    assert_eq!(d.attempts.len(), 2, "{:?}", d.attempts);
    assert_eq!(d.attempts[0].reason, Some(EndReason::Preempted));
    assert_eq!(d.attempts[0].exit_code, Some(0), "it saved and exited on its signal");
    // One `preempted` notification for alice's job, none for the urgent job or the retry-free restart.
    let db = rusqlite::Connection::open(dir.path().join("state/gantry.db")).unwrap();
    let kinds: Vec<(String, i64)> = db
        .prepare("SELECT kind, job_id FROM notify_events ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| k.0 == "preempted").collect::<Vec<_>>(),
        [&("preempted".to_string(), train)],
        "{kinds:?}"
    );
    let msg = d.attempts[0].message.clone().unwrap_or_default();
    assert_eq!(msg, format!("preempted by job {urgent} (root's 1-GPU job has priority 10, this one 0) after 10 GPU-minutes · resumes when GPUs free"));
    // Its 20 s of saving were honoured: the urgent job started after the train job exited.
    let u = e.job_detail(urgent).unwrap();
    assert!(
        u.attempts[0].started_at >= d.attempts[0].ended_at.unwrap(),
        "urgent started before the GPU was free"
    );
    let ran = d.attempts[0].ended_at.unwrap() - d.attempts[0].started_at;
    assert!(
        (620_000..=631_000).contains(&ran),
        "preempted at min_run (within a pass), exited 20 s after its signal: ran {ran} ms"
    );
    // Queued again at its place: before `later`, which was submitted after it.
    assert_eq!(final_state(&e, later).await, JobState::Succeeded);
    let l = e.job_detail(later).unwrap();
    assert!(
        d.attempts[1].started_at < l.attempts[0].started_at,
        "the preempted job resumed after the job queued behind it"
    );
    // It sees it is preemptible, and how often it was preempted; `retries: 0` did not fail it.
    let envs = env_of(&fake, "train");
    assert!(
        envs[0].contains(&"GANTRY_PREEMPTIBLE=1".to_string())
            && envs[0].contains(&"GANTRY_RESTART_COUNT=0".to_string()),
        "{:?}",
        envs[0]
    );
    assert!(envs[1].contains(&"GANTRY_RESTART_COUNT=1".to_string()), "{:?}", envs[1]);
    assert!(
        env_of(&fake, "later")[0].contains(&"GANTRY_RESTART_COUNT=0".to_string())
            && !env_of(&fake, "later")[0].contains(&"GANTRY_PREEMPTIBLE=1".to_string())
    );
    assert_eq!(env_of(&fake, "train").len(), 2, "two attempts");
    // `gantry usage`: the preempted attempt's GPU-hours, per user.
    let u = e.usage(0).unwrap();
    let alice = u.users.iter().find(|u| u.user == "alice").unwrap();
    assert!(
        (alice.gpu_hours_preempted - ran as f64 / 3_600_000.0).abs() < 1e-9,
        "{alice:?}"
    );
    assert_eq!(
        u.users.iter().find(|u| u.user == "root").unwrap().gpu_hours_preempted,
        0.0
    );
    assert_eq!(
        fake.started.lock().unwrap().len(),
        4,
        "train twice, urgent and later once: {:?}",
        fake.started.lock().unwrap()
    );
}

#[tokio::test(start_paused = true)]
async fn a_job_that_is_not_preemptible_is_never_preempted() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    fake.script(
        "train",
        Script {
            runtime: Duration::from_secs(1800),
            checkpoint: Some(Duration::from_secs(1)),
            ..Default::default()
        },
    );
    let (e, _h) = start_with(preempting(dir.path()), &fake);
    let root = Owner {
        uid: 0,
        gid: 0,
        name: "root".into(),
    };
    let train = submit(&e, "name: train\nimage: a\n");
    wait_state(&e, train, |s| s == JobState::Running).await;
    let urgent = e
        .submit(file("name: urgent\nimage: a\npriority: 100\n", &root))
        .unwrap()[0];
    assert_eq!(final_state(&e, train).await, JobState::Succeeded);
    assert_eq!(final_state(&e, urgent).await, JobState::Succeeded);
    assert!(fake.signals.lock().unwrap().is_empty());
    assert_eq!(e.job_detail(train).unwrap().attempts.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_engine_killed_mid_preemption_neither_loses_the_job_nor_runs_it_twice() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    // It ignores its signal: it is killed at the end of the 2 min grace (code 137).
    fake.script(
        "train",
        Script {
            runtime: Duration::from_secs(3600),
            ..Default::default()
        },
    );
    let (e, h) = start_with(preempting(dir.path()), &fake);
    let root = Owner {
        uid: 0,
        gid: 0,
        name: "root".into(),
    };
    let train = submit(
        &e,
        "name: train\nimage: a\npreemptible: true\ncheckpoint: {signal: SIGUSR1, grace: 2m}\n",
    );
    wait_state(&e, train, |s| s == JobState::Running).await;
    let urgent = e.submit(file("name: urgent\nimage: a\npriority: 10\n", &root)).unwrap()[0];
    // Inside the grace: the signal was sent, the container still runs.
    for _ in 0..100_000 {
        if !fake.signals.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(fake.signals.lock().unwrap().len(), 1);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(e.job_detail(train).unwrap().job.state, JobState::Running);
    e.shutdown();
    h.await.unwrap();
    assert_eq!(
        e.job_detail(train).unwrap().attempts[0].ended_at,
        None,
        "the first engine stopped before the end"
    );
    drop(e);
    // The container dies at the end of its grace while no engine runs; the new engine finds it
    // ended and records it preempted (not failed, not succeeded), then runs it again once.
    tokio::time::sleep(Duration::from_secs(120)).await;
    let (e2, _h2) = start_with(preempting(dir.path()), &fake);
    assert_eq!(final_state(&e2, urgent).await, JobState::Succeeded);
    assert_eq!(final_state(&e2, train).await, JobState::Succeeded);
    let d = e2.job_detail(train).unwrap();
    assert_eq!(
        d.attempts.iter().map(|a| a.reason).collect::<Vec<_>>(),
        vec![Some(EndReason::Preempted), Some(EndReason::Exited)],
        "{:?}",
        d.attempts
    );
    assert_eq!(env_of(&fake, "train").len(), 2, "once before, once after");
    assert_eq!(
        fake.started.lock().unwrap().len(),
        3,
        "train twice, urgent once: {:?}",
        fake.started.lock().unwrap()
    );
    let u = e2.job_detail(urgent).unwrap();
    assert!(
        u.attempts[0].started_at >= d.attempts[0].ended_at.unwrap(),
        "urgent ran beside the job it preempted"
    );
}

/// Issue 28 item 5: one 1-GPU job preempts one job, not two. The first victim's attempt ends and its
/// GPU frees, but the GPU samples still list its container for a moment; that is this engine's
/// container going away, not outside use, so the next pass places the waiting job there instead of
/// choosing a second victim (3 of 3 rounds picked one ~2 ms later before the fix).
#[tokio::test(start_paused = true)]
async fn one_preemption_frees_one_gpu_for_a_one_gpu_job_and_no_second_victim_is_chosen() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    for name in ["a", "b"] {
        fake.script(
            name,
            Script {
                runtime: Duration::from_secs(3600),
                checkpoint: Some(Duration::from_secs(5)),
                ..Default::default()
            },
        );
    }
    fake.script(
        "urgent",
        Script {
            runtime: Duration::from_secs(60),
            ..Default::default()
        },
    );
    let mut c = preempting(dir.path());
    c.gpus = Some("sim:2x24GiB".into());
    let (e, _h) = start_with(c, &fake);
    let root = Owner {
        uid: 0,
        gid: 0,
        name: "root".into(),
    };
    let a = submit(
        &e,
        "name: a\nimage: a\npreemptible: true\ncheckpoint: {signal: SIGUSR1, grace: 1m}\n",
    );
    let b = submit(
        &e,
        "name: b\nimage: a\npreemptible: true\ncheckpoint: {signal: SIGUSR1, grace: 1m}\n",
    );
    wait_state(&e, a, |s| s == JobState::Running).await;
    wait_state(&e, b, |s| s == JobState::Running).await;
    let urgent = e.submit(file("name: urgent\nimage: a\npriority: 10\n", &root)).unwrap()[0];
    // While the victim saves (5 s), it says so instead of plain `running`.
    while fake.signals.lock().unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let q = e.queue().unwrap();
    let victim = q
        .iter()
        .find(|x| (x.job.id == a || x.job.id == b) && x.reason.is_some());
    assert!(
        victim.is_some_and(|v| v.job.state == JobState::Running
            && v.reason
                .as_deref()
                .unwrap_or("")
                .starts_with("being preempted: got its checkpoint signal, saving")),
        "{q:?}"
    );
    assert_eq!(final_state(&e, urgent).await, JobState::Succeeded);
    let signalled: Vec<String> = fake.signals.lock().unwrap().iter().map(|s| s.0.clone()).collect();
    assert_eq!(signalled.len(), 1, "one victim for one GPU: {signalled:?}");
    let preempted = |id| {
        e.job_detail(id)
            .unwrap()
            .attempts
            .iter()
            .filter(|a| a.reason == Some(EndReason::Preempted))
            .count()
    };
    assert_eq!(preempted(a) + preempted(b), 1, "a {}, b {}", preempted(a), preempted(b));
}

/// Issue 28 (smaller): a Docker restart (without live-restore it stops every container) killed a
/// preemptible job, which then ended `failed`; it is queued again, as a preemption (not counted
/// against `retries`), and resumes. A job that is not preemptible still fails as before.
#[tokio::test(start_paused = true)]
async fn a_preemptible_job_killed_by_a_docker_restart_is_queued_again() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    for name in ["pre", "plain"] {
        fake.script(
            name,
            Script {
                runtime: Duration::from_secs(60),
                ..Default::default()
            },
        );
    }
    let mut c = preempting(dir.path());
    c.gpus = Some("sim:2x24GiB".into());
    let (e, _h) = start_with(c, &fake);
    let pre = submit(&e, "name: pre\nimage: a\npreemptible: true\nretries: 0\n");
    let plain = submit(&e, "name: plain\nimage: a\nretries: 0\n");
    wait_state(&e, pre, |s| s == JobState::Running).await;
    wait_state(&e, plain, |s| s == JobState::Running).await;
    fake.down.store(true, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(5)).await;
    fake.stop_all(143);
    tokio::time::sleep(Duration::from_secs(5)).await;
    fake.down.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(final_state(&e, plain).await, JobState::Failed);
    assert_eq!(final_state(&e, pre).await, JobState::Succeeded);
    let d = e.job_detail(pre).unwrap();
    assert_eq!(d.attempts.len(), 2, "{:?}", d.attempts);
    assert_eq!(d.attempts[0].reason, Some(EndReason::Preempted));
    let msg = d.attempts[0].message.clone().unwrap_or_default();
    assert!(
        msg.starts_with("preempted by a Docker restart (it stopped every container) after"),
        "{msg}"
    );
}
