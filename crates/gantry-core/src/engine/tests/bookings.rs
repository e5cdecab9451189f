//! GPU bookings: kept free, preempted for, released when unused or left idle, their owners told.

use super::*;

/// Two simulated GPUs, preemption on (so `preemptible: true` jobs are), and alice's booking of 1 GPU
/// for 1 h from the first half-hour slot at least an hour ahead.
async fn booked(dir: &std::path::Path, fake: &Arc<FakeExecutor>) -> (Arc<Engine>, i64, i64) {
    let mut c = preempting(dir);
    c.gpus = Some("sim:2x24GiB".into());
    let (e, _h) = start_with(c, fake);
    // The first pass reads the GPUs.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let slot = 1_800_000;
    let now = e.now();
    let start = (now + 3_600_000).div_euclid(slot) * slot + slot;
    let b = e
        .book(
            1000,
            "alice",
            crate::protocol::BookRequest {
                gpus: 1,
                gpu_type: None,
                start_ms: start,
                end_ms: start + 3_600_000,
                note: Some("demo".into()),
            },
        )
        .unwrap();
    (e, b.id, start)
}

fn reason(e: &Engine, id: i64) -> String {
    e.queue()
        .unwrap()
        .iter()
        .find(|x| x.job.id == id)
        .and_then(|x| x.reason.clone())
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn a_booking_keeps_long_jobs_off_its_gpu_preempts_a_preemptible_one_at_its_start_and_its_owner_starts_on_time() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    for n in ["long", "long2", "pre"] {
        fake.script(
            n,
            Script {
                runtime: Duration::from_secs(5 * 3600),
                ..Default::default()
            },
        );
    }
    fake.script(
        "mine",
        Script {
            runtime: Duration::from_secs(600),
            ..Default::default()
        },
    );
    let (e, booking, start) = booked(dir.path(), &fake).await;
    let b = bob();
    // Expected to run 5 h, past the booking's start: one goes on the free GPU, the other waits.
    let long = e
        .submit(file("name: long\nimage: a\nexpected_runtime: 5h\n", &b))
        .unwrap()[0];
    wait_state(&e, long, |s| s == JobState::Running).await;
    let long2 = e
        .submit(file("name: long2\nimage: a\nexpected_runtime: 5h\n", &b))
        .unwrap()[0];
    // A preemptible one may use the booked GPU until the booking starts.
    let pre = e.submit(file("name: pre\nimage: a\npreemptible: true\n", &b)).unwrap()[0];
    wait_state(&e, pre, |s| s == JobState::Running).await;
    assert_eq!(e.job_detail(long2).unwrap().job.state, JobState::Queued);
    let why = reason(&e, long2);
    assert!(
        why.contains("booked by alice from") && why.contains("not expected to end by then"),
        "{why}"
    );
    let other_gpu = e.job_detail(long).unwrap().attempts[0].gpus.clone();
    assert_ne!(e.job_detail(pre).unwrap().attempts[0].gpus, other_gpu);
    // alice's job, queued before the start, waits for it (both GPUs are taken) and starts at it.
    let mine = submit(&e, "name: mine\nimage: a\n");
    tokio::time::sleep(Duration::from_millis((start - e.now() - 60_000).max(0) as u64)).await;
    assert_eq!(
        e.job_detail(mine).unwrap().job.state,
        JobState::Queued,
        "nothing moves before the start"
    );
    assert_eq!(e.job_detail(pre).unwrap().job.state, JobState::Running);
    wait_state(&e, mine, |s| s == JobState::Running).await;
    let d = e.job_detail(mine).unwrap();
    let late = d.attempts[0].started_at - start;
    assert!(
        (0..60_000).contains(&late),
        "alice's job started {late} ms after her booking's start"
    );
    // The preemptible job was preempted for the booking, and says so; the long one still runs.
    let p = e.job_detail(pre).unwrap();
    assert_eq!(p.attempts[0].reason, Some(EndReason::Preempted), "{:?}", p.attempts);
    let msg = p.attempts[0].message.clone().unwrap_or_default();
    assert!(
        msg.starts_with(&format!("preempted by alice's booking {booking} (")),
        "{msg}"
    );
    assert_eq!(
        e.job_detail(long).unwrap().job.state,
        JobState::Running,
        "a non-preemptible job is never stopped for a booking"
    );
    // During the booking bob's jobs wait with the booking named.
    let why = reason(&e, pre);
    assert!(why.contains("preempted by alice's booking"), "{why}");
    let why = reason(&e, long2);
    assert!(why.contains("booked by alice until"), "{why}");
    let list = e.bookings(1001, &Default::default()).unwrap();
    let row = list.bookings.iter().find(|r| r.id == booking).unwrap();
    assert_eq!(
        (row.state, row.note.as_deref(), row.gpu_indices.len()),
        (crate::protocol::BookingState::Active, None, 1),
        "{row:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_booking_nobody_uses_is_released_after_release_after_and_its_owner_notified() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    let (e, booking, start) = booked(dir.path(), &fake).await;
    let hook = crate::protocol::notify::NotifyTarget::Webhook {
        url: "http://hooks.example/b".into(),
    };
    e.store()
        .notify_subscribe(
            1000,
            "alice",
            &hook,
            &[crate::protocol::notify::NotifyEvent::BookingReleased],
            None,
            10,
        )
        .unwrap()
        .unwrap();
    // Past the start, but within release_after (30 min): still held.
    tokio::time::sleep(Duration::from_millis((start - e.now() + 20 * 60_000) as u64)).await;
    assert_eq!(
        e.reader().booking(booking).unwrap().unwrap().state(e.now()),
        crate::protocol::BookingState::Active
    );
    tokio::time::sleep(Duration::from_secs(15 * 60)).await;
    let b = e.reader().booking(booking).unwrap().unwrap();
    assert_eq!(
        (b.closed, b.closed_why.as_deref()),
        (
            Some(crate::protocol::BookingState::Released),
            Some("released: unused for 30m after its start")
        )
    );
    let db = rusqlite::Connection::open(dir.path().join("state/gantry.db")).unwrap();
    let kinds: Vec<(String, Option<i64>)> = db
        .prepare("SELECT kind, uid FROM notify_events ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(
        kinds.contains(&("booking_released".to_string(), Some(1000))),
        "{kinds:?}"
    );
    // A bob job may now use both GPUs.
    let b2 = e.submit(file("name: wide\nimage: a\ngpus: 2\n", &bob())).unwrap()[0];
    wait_state(&e, b2, |s| s == JobState::Running).await;
}

/// Issue 29 hole 2: a booking its owner used, then left, is released `release_after` after their last
/// job on it, even while they keep a job queued (here one that cannot start: it wants both GPUs).
#[tokio::test(start_paused = true)]
async fn a_used_booking_left_idle_is_released_whatever_its_owner_has_queued() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    fake.script(
        "long",
        Script {
            runtime: Duration::from_secs(5 * 3600),
            ..Default::default()
        },
    );
    fake.script(
        "mine",
        Script {
            runtime: Duration::from_secs(600),
            ..Default::default()
        },
    );
    let (e, booking, start) = booked(dir.path(), &fake).await;
    let long = e
        .submit(file("name: long\nimage: a\nexpected_runtime: 5h\n", &bob()))
        .unwrap()[0];
    wait_state(&e, long, |s| s == JobState::Running).await;
    tokio::time::sleep(Duration::from_millis((start - e.now()) as u64)).await;
    let mine = submit(&e, "name: mine\nimage: a\n");
    wait_state(&e, mine, |s| s == JobState::Succeeded).await;
    assert!(e.reader().booking(booking).unwrap().unwrap().used_ms.is_some());
    // alice keeps a job queued that cannot start (bob's job holds the other GPU).
    let wide = submit(&e, "name: wide\nimage: a\ngpus: 2\n");
    tokio::time::sleep(Duration::from_secs(20 * 60)).await;
    assert_eq!(
        e.reader().booking(booking).unwrap().unwrap().closed,
        None,
        "within release_after"
    );
    tokio::time::sleep(Duration::from_secs(15 * 60)).await;
    let b = e.reader().booking(booking).unwrap().unwrap();
    assert_eq!(
        (b.closed, b.closed_why.as_deref()),
        (
            Some(crate::protocol::BookingState::Released),
            Some("released: unused for 30m since its owner's last job on it")
        ),
        "the booking ends at {} (now {})",
        b.end_ms,
        e.now()
    );
    assert!(e.now() < b.end_ms, "released before its end");
    assert_eq!(e.job_detail(wide).unwrap().job.state, JobState::Queued);
}

#[tokio::test(start_paused = true)]
async fn a_bookings_owner_is_told_once_that_it_starts_soon_even_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    let mut c = preempting(dir.path());
    c.gpus = Some("sim:2x24GiB".into());
    let (e, h) = start_with(c.clone(), &fake);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let slot = 1_800_000;
    let start = (e.now() + 3_600_000).div_euclid(slot) * slot + slot;
    let booking = e
        .book(
            1000,
            "alice",
            crate::protocol::BookRequest {
                gpus: 1,
                gpu_type: None,
                start_ms: start,
                end_ms: start + 3_600_000,
                note: None,
            },
        )
        .unwrap()
        .id;
    let told = || {
        let db = rusqlite::Connection::open(dir.path().join("state/gantry.db")).unwrap();
        let mut q = db
            .prepare("SELECT uid, at, text FROM notify_events WHERE kind = 'booking_starting'")
            .unwrap();
        let rows: Vec<(u32, i64, String)> = q
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        rows
    };
    let lead = crate::defaults::BOOKING_STARTING_LEAD.as_millis() as i64;
    // Not before the lead time.
    tokio::time::sleep(Duration::from_millis((start - lead - e.now() - 60_000) as u64)).await;
    assert!(told().is_empty(), "told too early: {:?}", told());
    // Within the lead, once, to its owner, naming the booking.
    tokio::time::sleep(Duration::from_secs(3 * 60)).await;
    let t = told();
    assert_eq!(t.len(), 1, "{t:?}");
    assert_eq!(t[0].0, 1000);
    assert!(t[0].1 >= start - lead && t[0].1 < start, "{t:?}");
    assert!(t[0].2.starts_with(&format!("booking {booking}: 1 GPU ")), "{t:?}");
    // A new engine on the same state (its memory empty) does not tell again.
    e.shutdown();
    h.await.unwrap();
    drop(e);
    let (e2, _h) = start_with(c, &fake);
    tokio::time::sleep(Duration::from_secs(5 * 60)).await;
    assert!(e2.now() < start);
    assert_eq!(told().len(), 1, "told again after a restart: {:?}", told());
}

#[tokio::test(start_paused = true)]
async fn a_non_preemptible_job_on_a_booked_gpu_is_never_stopped_the_booking_waits_for_it_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    // bob's job runs 2 h, started before alice booked the only GPU from about an hour on.
    fake.script(
        "early",
        Script {
            runtime: Duration::from_secs(2 * 3600),
            ..Default::default()
        },
    );
    fake.script(
        "mine",
        Script {
            runtime: Duration::from_secs(600),
            ..Default::default()
        },
    );
    let (e, _h) = start_with(preempting(dir.path()), &fake);
    let early = e.submit(file("name: early\nimage: a\n", &bob())).unwrap()[0];
    wait_state(&e, early, |s| s == JobState::Running).await;
    let slot = 1_800_000;
    let start = (e.now() + 3_600_000).div_euclid(slot) * slot;
    let booking = e
        .book(
            1000,
            "alice",
            crate::protocol::BookRequest {
                gpus: 1,
                gpu_type: None,
                start_ms: start,
                end_ms: start + 2 * 3_600_000,
                note: None,
            },
        )
        .unwrap()
        .id;
    let mine = submit(&e, "name: mine\nimage: a\n");
    tokio::time::sleep(Duration::from_millis((start - e.now() + 60_000) as u64)).await;
    assert_eq!(
        e.job_detail(early).unwrap().job.state,
        JobState::Running,
        "never stopped for a booking"
    );
    let row = e
        .bookings(1000, &Default::default())
        .unwrap()
        .bookings
        .into_iter()
        .find(|b| b.id == booking)
        .unwrap();
    assert_eq!(
        (row.state, row.waiting_for.clone(), row.gpu_indices.clone()),
        (crate::protocol::BookingState::Active, vec![early], vec![0]),
        "{row:?}"
    );
    // Waiting for bob's job (which ends about an hour after the start), it is not a no-show past
    // release_after (30 min)...
    tokio::time::sleep(Duration::from_secs(40 * 60)).await;
    assert_eq!(
        e.reader().booking(booking).unwrap().unwrap().closed,
        None,
        "released while it waited for a job"
    );
    // ... and once bob's job ends, alice's starts on its GPU.
    wait_state(&e, mine, |s| s == JobState::Running).await;
    let started = e.job_detail(mine).unwrap().attempts[0].started_at;
    let ended = e.job_detail(early).unwrap().attempts[0].ended_at.unwrap();
    assert!(started >= ended, "alice's job started before bob's ended");
}
