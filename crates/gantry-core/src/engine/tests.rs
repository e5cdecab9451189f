//! The engine's retry, timeout, cancel, recovery and crash handling, in-process against the fake
//! executor under `tokio::time::pause` (real SQLite in a temp dir; Docker is covered by tests/).

use std::sync::Arc;
use std::time::Duration;

use super::submit::{Spec, Submission};
use super::{Config, Engine, Paths, RunOn};
use crate::clock::TokioClock;
use crate::executor::fake::{FakeExecutor, Script};
use crate::store::{EndReason, JobState, Owner};

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
    let shown = String::from_utf8(super::strip_stamps(stored)).unwrap();
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

#[test]
fn the_start_up_line_says_1_cpu_not_1_cpus() {
    use crate::scheduler::CpuRam;
    const G: u64 = 1 << 30;
    let line = super::for_jobs_line(
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
    let line = super::for_jobs_line(
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

fn bob() -> Owner {
    Owner {
        uid: 1001,
        gid: 1001,
        name: "bob".into(),
    }
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
    let want = format!("starts at {}", crate::units::local_hhmm(queued_at + 600_000));
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
