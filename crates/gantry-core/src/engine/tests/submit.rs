//! What a submit checks and answers: CPUs and memory the machine lacks, idempotency keys, `begin`,
//! dry runs.

use super::*;

#[tokio::test(start_paused = true)]
async fn cpus_and_memory_the_machine_can_never_give_are_refused_at_submit() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open_with(cfg(dir.path()), FakeExecutor::new()).unwrap();
    let err = e
        .submit(file("image: a\ngpus: 0\ncpus: 1000\n", &alice()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("asks for 1000 CPUs, this machine has") && err.contains("at most `cpus:"),
        "{err}"
    );
    let err = e
        .submit(file("image: a\ngpus: 0\nmemory: 1000TiB\n", &alice()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("of memory, this machine has"), "{err}");
    assert!(
        e.submit(file("image: a\ngpus: 0\ncpus: 0.5\nmemory: 64MiB\n", &alice()))
            .is_ok(),
        "what fits is queued"
    );
}

/// Issue 18, item 13: a submit sent again with its idempotency key (its answer was lost) gets the
/// first one's jobs, before any check and after a restart too; a key is for one submission; and
/// another user's same key is another key (bob replaying alice's key gets his own jobs).
#[test]
fn a_submit_sent_again_with_its_key_gets_the_first_jobs_and_never_another_users() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _g = rt.enter();
    let fake = FakeExecutor::new();
    let open = || {
        let mut c = cfg(dir.path());
        c.lab.policy.max_queued_per_user = 2;
        Engine::open_with(c, fake.clone()).unwrap()
    };
    let keyed = |text: &'static str, owner: &'static Owner, key: &'static str| Submission {
        idempotency_key: Some(key),
        ..file(text, owner)
    };
    static ALICE: std::sync::LazyLock<Owner> = std::sync::LazyLock::new(alice);
    static BOB: std::sync::LazyLock<Owner> = std::sync::LazyLock::new(|| Owner {
        uid: 1001,
        gid: 1001,
        name: "bob".into(),
    });
    let matrix = "name: m\nimage: a\nmatrix: {x: [1, 2]}\n";
    let e = open();
    let first = e.submit(keyed(matrix, &ALICE, "alice-key-1")).unwrap();
    assert_eq!(first.len(), 2);
    // The first try's jobs fill alice's queue cap (2): the resend is answered all the same, and queues nothing.
    assert_eq!(e.submit(keyed(matrix, &ALICE, "alice-key-1")).unwrap(), first);
    let err = e
        .submit(keyed("name: other\nimage: a\n", &ALICE, "alice-key-1"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("already used for another submission"), "{err}");
    // bob sends alice's key with alice's very spec: his own jobs, never hers.
    let bobs = e.submit(keyed(matrix, &BOB, "alice-key-1")).unwrap();
    assert_eq!(bobs.len(), 2);
    for id in &bobs {
        assert!(!first.contains(id), "bob got alice's job {id}");
        assert_eq!(e.job_detail(*id).unwrap().job.owner_uid, 1001);
    }
    for bad in ["short", &"k".repeat(129), "has a space", "semi;colon", "new\nline-key"] {
        let bad: &'static str = Box::leak(bad.to_string().into_boxed_str());
        let err = e
            .submit(keyed("name: x\nimage: a\n", &BOB, bad))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("idempotency key is not one Gantry accepts"),
            "{bad:?}: {err}"
        );
    }
    drop(e);
    // After a restart: the key was written with the jobs.
    let e = open();
    assert_eq!(e.submit(keyed(matrix, &ALICE, "alice-key-1")).unwrap(), first);
    assert_eq!(e.submit(keyed(matrix, &BOB, "alice-key-1")).unwrap(), bobs);
    let mut queued: Vec<i64> = e.queue().unwrap().iter().map(|q| q.job.id).collect();
    queued.sort();
    assert_eq!(
        queued,
        [first.clone(), bobs.clone()].concat(),
        "alice's two and bob's two, nothing more"
    );
    // Without a key every submit is new (the drop folder and old clients).
    assert_eq!(
        e.submit(file(
            "name: m\nimage: a\n",
            &Owner {
                uid: 1002,
                gid: 1002,
                name: "carol".into()
            }
        ))
        .unwrap()
        .len(),
        1
    );
}

/// Issue 31: a job with `begin` waits until then, says so, and holds nothing meanwhile: a later job
/// runs on the one GPU first; at its time it starts (paused clock: the engine's now moves with it).
#[tokio::test(start_paused = true)]
async fn a_job_with_begin_waits_until_then_and_holds_nothing_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    fake.script(
        "now",
        Script {
            runtime: Duration::from_secs(60),
            ..Default::default()
        },
    );
    let (e, _h) = start(dir.path(), &fake);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let queued_at = e.now();
    let later = submit(&e, "name: later\nimage: a\nbegin: +10m\n");
    let now = submit(&e, "name: now\nimage: a\n");
    wait_state(&e, now, |s| s == JobState::Running).await;
    let entry = e.queue().unwrap().into_iter().find(|q| q.job.id == later).unwrap();
    // The reason names the day too when `begin` is not today (a run just before midnight).
    let want = crate::engine::pass::starts_at(queued_at + 600_000, queued_at);
    assert!(
        entry.reason.as_deref().is_some_and(|r| r.starts_with(&want)),
        "{:?}, want {want:?}",
        entry.reason
    );
    assert_eq!(e.job_detail(later).unwrap().job.state, JobState::Queued);
    assert_eq!(final_state(&e, now).await, JobState::Succeeded);
    // The GPU is free long before 10 minutes: still it waits for its time.
    tokio::time::sleep(Duration::from_secs(5 * 60)).await;
    assert_eq!(e.job_detail(later).unwrap().job.state, JobState::Queued);
    assert_eq!(final_state(&e, later).await, JobState::Succeeded);
    let started = e.job_detail(later).unwrap().attempts[0].started_at;
    assert!(
        (queued_at + 600_000..queued_at + 600_000 + 5_000).contains(&started),
        "started {} ms after it was queued; its begin was 10 min",
        started - queued_at
    );
}

/// `begin` in the past or beyond the lab's `max_begin` is refused with what to write instead.
#[tokio::test(start_paused = true)]
async fn a_begin_in_the_past_or_too_far_ahead_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    let (e, _h) = start(dir.path(), &fake);
    for (spec, want) in [
        ("image: a\nbegin: 2020-01-01 10:00\n", "is in the past"),
        ("image: a\nbegin: +30d\n", "is more than 7d ahead"),
        ("image: a\nbegin: teatime\n", "is not a time"),
    ] {
        let err = e.submit(file(spec, &alice())).unwrap_err().to_string();
        assert!(err.contains(want), "{spec}: {err}");
    }
    assert!(e.queue().unwrap().is_empty());
}

/// A dry run checks as a submit does and says where the job would start, queueing nothing (no
/// row, no id used); with the GPU taken it says why it would wait.
#[tokio::test(start_paused = true)]
async fn a_dry_run_queues_nothing_and_says_where_or_why() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    fake.script(
        "busy",
        Script {
            runtime: Duration::from_secs(3600),
            ..Default::default()
        },
    );
    let (e, _h) = start(dir.path(), &fake);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let p = e
        .preview("name: try\nimage: a\n", "try.yaml", None, None, &alice())
        .unwrap();
    assert_eq!(p.jobs.len(), 1);
    assert!(p.jobs[0].starts_now && p.jobs[0].gpus == vec![0], "{:?}", p.jobs[0]);
    assert!(p.checks.iter().any(|c| c.starts_with("priority 0")), "{:?}", p.checks);
    assert!(e.queue().unwrap().is_empty(), "the dry run queued nothing");
    let busy = submit(&e, "name: busy\nimage: a\nexpected_runtime: 1h\n");
    wait_state(&e, busy, |s| s == JobState::Running).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let p = e
        .preview("name: try\nimage: a\n", "try.yaml", None, None, &alice())
        .unwrap();
    let j = &p.jobs[0];
    assert!(!j.starts_now && j.gpus.is_empty(), "{j:?}");
    assert!(j.reason.as_deref().is_some_and(|r| !r.is_empty()), "{j:?}");
    assert!(j.estimated_start.is_some_and(|t| t >= e.now() + 3_000_000), "{j:?}");
    let p = e
        .preview(
            "name: sweep\nimage: a\nmatrix: {lr: [1, 2]}\n",
            "s.yaml",
            None,
            None,
            &alice(),
        )
        .unwrap();
    assert_eq!(p.jobs.len(), 2, "a matrix previews each job");
    let err = e
        .preview("image: a\npriority: 5000\n", "p.yaml", None, None, &alice())
        .unwrap_err();
    assert!(err.to_string().contains("outside the range"), "{err}");
    assert_eq!(e.queue().unwrap().len(), 1, "only the real submit is queued");
    let next = submit(&e, "name: next\nimage: a\n");
    assert_eq!(next, busy + 1, "no dry run used a job id");
}
