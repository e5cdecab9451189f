//! The queue as `gantry ls` sees it: served from memory, and the page on a deep queue.

use super::*;

/// Issue 22, item 7: the queue (`gantry ls`) comes from the queue in memory and the started jobs'
/// rows, never from parsing specs: a queued job whose stored spec could not be read back as a job
/// is still listed, with everything the row shows, in id order after the running one.
#[tokio::test(start_paused = true)]
async fn the_queue_is_served_without_reading_any_spec() {
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
    let run = submit(&e, "name: long\nimage: a\ngpus: 1\n");
    wait_state(&e, run, |s| s == JobState::Running).await;
    let waiting: Vec<i64> = (0..3)
        .map(|i| {
            submit(
                &e,
                &format!("name: w{i}\nimage: img:{i}\ngpus: 1\ngpu_memory: 2GiB\npriority: {i}\n"),
            )
        })
        .collect();
    // No spec to parse: each queued job's stored spec is an empty object.
    let db = rusqlite::Connection::open(dir.path().join("state/gantry.db")).unwrap();
    assert_eq!(
        db.execute("UPDATE jobs SET spec_json = '{}' WHERE state = 'queued'", [])
            .unwrap(),
        3
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let q = e.queue().unwrap();
    let ids: Vec<i64> = q.iter().map(|x| x.job.id).collect();
    assert_eq!(ids, [vec![run], waiting.clone()].concat());
    assert_eq!(
        (
            q[0].job.state,
            q[0].gpus_assigned.as_slice(),
            q[0].job.started_at.is_some()
        ),
        (JobState::Running, &[0][..], true)
    );
    let w = &q[3].job;
    assert_eq!(
        (
            w.name.as_str(),
            w.image.as_str(),
            w.gpus,
            w.gpu_memory,
            w.priority,
            w.state,
            w.owner.as_str(),
            w.owner_uid
        ),
        ("w2", "img:2", 1, Some(2 << 30), 2, JobState::Queued, "alice", 1000)
    );
    // Highest priority first.
    assert_eq!(
        q[1..].iter().map(|x| x.position).collect::<Vec<_>>(),
        [Some(3), Some(2), Some(1)]
    );
    assert!(q[1..].iter().all(|x| x.reason.is_some()), "{q:?}");
}

/// `gantry ls` on a deep queue: the page holds every running job, the next `limit` to start (in
/// scheduling order, not by id) and the caller's own first `limit`, and says how many are queued.
#[tokio::test(start_paused = true)]
async fn the_ls_page_shows_the_next_jobs_to_start_and_the_callers_own() {
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
    let run = submit(&e, "name: long\nimage: a\ngpus: 1\n");
    wait_state(&e, run, |s| s == JobState::Running).await;
    let bob = Owner {
        uid: 1001,
        gid: 1001,
        name: "bob".into(),
    };
    // 20 of alice's at priority 0, then bob's 5, then 5 of alice's at priority 5: those go first.
    let low: Vec<i64> = (0..20)
        .map(|i| submit(&e, &format!("name: low{i}\nimage: a\ngpus: 1\n")))
        .collect();
    let bobs: Vec<i64> = (0..5)
        .map(|i| {
            e.submit(file(&format!("name: b{i}\nimage: a\ngpus: 1\n"), &bob))
                .unwrap()[0]
        })
        .collect();
    let high: Vec<i64> = (0..5)
        .map(|i| submit(&e, &format!("name: high{i}\nimage: a\ngpus: 1\npriority: 5\n")))
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let page = |limit: usize, uid: u32| -> crate::protocol::QueuePage {
        serde_json::from_slice(&e.queue_page_json(limit, uid).unwrap()).unwrap()
    };
    let ids = |p: &crate::protocol::QueuePage| p.jobs.iter().map(|j| j.job.id).collect::<Vec<_>>();
    // bob asks for 3: the running job, the three next to start (alice's high ones), his first three.
    let p = page(3, 1001);
    assert_eq!(p.queued, 30);
    assert_eq!(ids(&p), [vec![run], bobs[..3].to_vec(), high[..3].to_vec()].concat());
    // alice asks for 3: her own first three are the oldest low ones; the next three are high.
    let p = page(3, 1000);
    assert_eq!(ids(&p), [vec![run], low[..3].to_vec(), high[..3].to_vec()].concat());
    // A limit past the queue's depth is the whole queue, as `--all` lists it.
    assert_eq!(
        ids(&page(1000, 1001)),
        e.queue().unwrap().iter().map(|q| q.job.id).collect::<Vec<_>>()
    );
}
