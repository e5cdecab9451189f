//! The Slurm backend in-process, against `FakeSlurm` under `tokio::time::pause` (real SQLite in a
//! temp dir): recovery after a restart, cancel, timeout and the output copy. A real Slurm is covered
//! by tests/slurm.rs.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, TokioClock};
use crate::engine::{Config, Engine, Paths, RunOn};
use crate::slurm::fake::{FakeSlurm, Script};
use crate::slurm::{marker, BackendChoice, Settings};
use crate::store::{EndReason, JobState, Owner};

fn cfg(dir: &std::path::Path) -> Config {
    let mut c = Config::new(Paths::in_dir(dir.join("state"), dir.join("inbox")));
    c.gpus = Some("sim:1x24GiB".into());
    c.lab.policy.retry_backoff = Duration::from_secs(1);
    c.lab.policy.stop_grace = Duration::from_secs(1);
    c.lab.backend = BackendChoice::Slurm;
    let logs = dir.join("slurm-logs");
    std::fs::create_dir_all(&logs).unwrap();
    c.lab.slurm = Settings {
        poll: Duration::from_secs(1),
        log_dir: Some(logs),
        ..Default::default()
    };
    c
}

/// Jobs run as the test's own user: Slurm's output must be a file its owner owns, and only root may
/// hand files to someone else.
fn me() -> Owner {
    let uid = nix::unistd::geteuid();
    let user = nix::unistd::User::from_uid(uid)
        .unwrap()
        .expect("the test's user has a passwd entry");
    Owner {
        uid: uid.as_raw(),
        gid: nix::unistd::getegid().as_raw(),
        name: user.name,
    }
}

struct Cluster {
    dir: tempfile::TempDir,
    clock: Arc<dyn Clock>,
    slurm: Arc<FakeSlurm>,
}

impl Cluster {
    fn new() -> Cluster {
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
        Cluster {
            dir: tempfile::tempdir().unwrap(),
            slurm: FakeSlurm::new(clock.clone()),
            clock,
        }
    }

    fn open_with(&self, c: Config) -> Arc<Engine> {
        Engine::open_on(c, RunOn::Slurm(self.slurm.clone()), self.clock.clone()).unwrap()
    }

    fn open(&self) -> Arc<Engine> {
        self.open_with(cfg(self.dir.path()))
    }
}

fn run(e: &Arc<Engine>) -> tokio::task::JoinHandle<()> {
    let e = e.clone();
    tokio::spawn(async move { e.run().await.unwrap() })
}

fn submit(e: &Engine, yaml: &str) -> i64 {
    let spec = crate::engine::submit::Spec::File {
        text: yaml,
        file_name: "test.yaml",
        base_dir: None,
        begin: None,
    };
    e.submit(crate::engine::submit::Submission {
        spec,
        owner: &me(),
        source: "test".into(),
        source_key: None,
        idempotency_key: None,
    })
    .unwrap()[0]
}

async fn wait_for(e: &Engine, id: i64, want: impl Fn(JobState) -> bool) -> JobState {
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
    wait_for(e, id, |s| s.is_final()).await
}

fn slurm_id(e: &Engine, id: i64, n: usize) -> Option<u64> {
    e.job_detail(id).unwrap().attempts.get(n).and_then(|a| a.slurm_job_id)
}

/// After a restart, an attempt with a recorded Slurm id is followed again (not submitted again); one
/// caught between `sbatch` and recording its id is found by its marker among its OWNER's Slurm jobs
/// and adopted; one whose marker only another user's job carries is queued again and submitted once.
#[tokio::test(start_paused = true)]
async fn a_restart_follows_recorded_ids_and_finds_the_others_by_the_owners_marker_only() {
    let c = Cluster::new();
    c.slurm.script(
        "train",
        Script {
            runtime: Duration::from_secs(60),
            ..Default::default()
        },
    );
    c.slurm.script(
        "adopted",
        Script {
            runtime: Duration::from_secs(30),
            ..Default::default()
        },
    );
    let e = c.open();
    let h = run(&e);
    let followed = submit(&e, "name: train\nimage: a\n");
    wait_for(&e, followed, |s| s == JobState::Running).await;
    e.shutdown();
    h.await.unwrap();
    drop(e);

    // The engine died right after `sbatch` for these two: attempts without a Slurm id.
    let e = c.open();
    let adopted = submit(&e, "name: adopted\nimage: a\n");
    let forged = submit(&e, "name: forged\nimage: a\n");
    for id in [adopted, forged] {
        e.store()
            .begin_attempt_noted(id, &[], &[], Some("submitting to Slurm"))
            .unwrap()
            .unwrap();
    }
    let mine = c.slurm.inject(me().uid, "adopted", &marker(&e.db_uid, adopted, 1));
    // Anyone may put any comment on their own Slurm job: another user's job with the marker.
    let theirs = c.slurm.inject(me().uid + 1, "forged", &marker(&e.db_uid, forged, 1));
    let before = c.slurm.submitted.lock().unwrap().len();
    let _h = run(&e);

    assert_eq!(final_state(&e, followed).await, JobState::Succeeded);
    assert_eq!(final_state(&e, adopted).await, JobState::Succeeded);
    assert_eq!(final_state(&e, forged).await, JobState::Succeeded);
    assert_eq!(
        e.job_detail(followed).unwrap().attempts.len(),
        1,
        "followed again, not run again"
    );
    let a = e.job_detail(adopted).unwrap();
    assert_eq!(
        (a.attempts.len(), a.attempts[0].slurm_job_id),
        (1, Some(mine)),
        "adopted: its own Slurm job, recorded"
    );
    let f = e.job_detail(forged).unwrap();
    assert_eq!(
        f.attempts.len(),
        2,
        "the first attempt never reached Slurm; the job is submitted again"
    );
    assert_eq!(f.attempts[0].reason, Some(EndReason::Lost));
    assert_ne!(
        slurm_id(&e, forged, 1),
        Some(theirs),
        "another user's job is never adopted"
    );
    let submitted: Vec<u64> = c.slurm.submitted.lock().unwrap()[before..]
        .iter()
        .map(|s| s.1)
        .collect();
    assert_eq!(
        submitted,
        vec![slurm_id(&e, forged, 1).unwrap()],
        "after the restart only the forged one's job went to Slurm, once"
    );
    assert!(std::fs::read_to_string(e.log_of(adopted)).unwrap().contains(&format!(
        "found as Slurm job {mine} after an engine restart (not submitted again)"
    )));
}

/// Cancel is `scancel` as the job's owner, running or still pending in Slurm.
#[tokio::test(start_paused = true)]
async fn cancel_scancels_as_the_owner_whether_it_runs_or_pends() {
    let c = Cluster::new();
    c.slurm.script(
        "long",
        Script {
            runtime: Duration::from_secs(3600),
            ..Default::default()
        },
    );
    c.slurm.script(
        "waits",
        Script {
            pending: Duration::from_secs(3600),
            ..Default::default()
        },
    );
    let e = c.open();
    let _h = run(&e);
    let running = submit(&e, "name: long\nimage: a\n");
    let pending = submit(&e, "name: waits\nimage: a\n");
    wait_for(&e, running, |s| s == JobState::Running).await;
    while slurm_id(&e, pending, 0).is_none() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let why = e
        .queue()
        .unwrap()
        .into_iter()
        .find(|q| q.job.id == pending)
        .and_then(|q| q.reason)
        .unwrap_or_default();
    assert!(
        why.contains("waiting for GPUs, CPUs or memory to free up in Slurm (Resources)"),
        "{why}"
    );
    e.cancel(running, me().uid).unwrap();
    e.cancel(pending, me().uid).unwrap();
    assert_eq!(final_state(&e, running).await, JobState::Cancelled);
    assert_eq!(final_state(&e, pending).await, JobState::Cancelled);
    let r = &e.job_detail(running).unwrap().attempts[0];
    assert_eq!((r.reason, r.exit_code), (Some(EndReason::Cancelled), Some(143)));
    let p = &e.job_detail(pending).unwrap().attempts[0];
    assert!(
        p.message.as_deref().unwrap_or("").contains("before it started"),
        "{:?}",
        p.message
    );
    let mut cancels = c.slurm.cancels.lock().unwrap().clone();
    cancels.sort();
    let mut want = vec![
        (me().name, slurm_id(&e, running, 0).unwrap().to_string()),
        (me().name, slurm_id(&e, pending, 0).unwrap().to_string()),
    ];
    want.sort();
    assert_eq!(cancels, want);
}

/// Gantry's own timeout counts from when Slurm started the job (not from the submit), and is a
/// `scancel`; a timeout is never retried.
#[tokio::test(start_paused = true)]
async fn the_timeout_counts_from_slurms_start_and_is_never_retried() {
    let c = Cluster::new();
    c.slurm.script(
        "slow",
        Script {
            pending: Duration::from_secs(20),
            runtime: Duration::from_secs(3600),
            ..Default::default()
        },
    );
    let e = c.open();
    let _h = run(&e);
    let id = submit(&e, "name: slow\nimage: a\ntimeout: 5s\nretries: 2\n");
    assert_eq!(final_state(&e, id).await, JobState::TimedOut);
    let d = e.job_detail(id).unwrap();
    assert_eq!(d.attempts.len(), 1, "a timeout is never retried");
    let a = &d.attempts[0];
    assert_eq!(a.reason, Some(EndReason::Timeout));
    let ran = a.ended_at.unwrap() - a.started_at;
    // Slurm reports its start in whole seconds; the end is seen at the next `squeue` after `scancel`.
    assert!((5_000..8_000).contains(&ran), "it ran {ran} ms for a 5 s timeout");
    assert!(
        a.started_at - d.job.submitted_at >= 19_000,
        "started {} ms after the submit: the 20 s pending is not counted",
        a.started_at - d.job.submitted_at
    );
    assert_eq!(c.slurm.cancels.lock().unwrap().len(), 1);
    let log = std::fs::read_to_string(e.log_of(id)).unwrap();
    assert!(log.contains("stopping: the 5s timeout passed"), "{log}");
}

/// Slurm's output is copied into the job's log once, in order; past the lab's cap the log says so,
/// as a Docker job's log does.
#[tokio::test(start_paused = true)]
async fn output_is_copied_once_and_a_capped_log_says_it_was_truncated() {
    let c = Cluster::new();
    let lines: Vec<String> = (1..=100).map(|i| format!("line {i:03}")).collect();
    c.slurm.script(
        "talks",
        Script {
            runtime: Duration::from_secs(5),
            output: lines.clone(),
            ..Default::default()
        },
    );
    let e = c.open();
    let h = run(&e);
    let id = submit(&e, "name: talks\nimage: a\n");
    assert_eq!(final_state(&e, id).await, JobState::Succeeded);
    let log = std::fs::read_to_string(e.log_of(id)).unwrap();
    let copied: Vec<&str> = log.lines().filter(|l| l.starts_with("line ")).collect();
    assert_eq!(copied, lines, "every line once, in order:\n{log}");
    assert!(!log.contains("log truncated"));
    e.shutdown();
    h.await.unwrap();
    drop(e);

    let mut capped = cfg(c.dir.path());
    capped.lab.policy.log_cap = 1000;
    let e = c.open_with(capped);
    let _h = run(&e);
    let id = submit(&e, "name: talks\nimage: a\n");
    assert_eq!(final_state(&e, id).await, JobState::Succeeded);
    let log = std::fs::read_to_string(e.log_of(id)).unwrap();
    assert_eq!(
        log.matches("[gantry] log truncated: the job wrote more than 1000 bytes")
            .count(),
        1,
        "{log}"
    );
    let copied: Vec<&str> = log.lines().filter(|l| l.starts_with("line ")).collect();
    assert!(
        !copied.is_empty() && copied.len() < 100 && copied[..] == lines[..copied.len()],
        "the start of the output, then the note:\n{log}"
    );
    let note = log.find("log truncated").unwrap();
    assert!(
        !log[note..].contains("line "),
        "nothing of the output after the note:\n{log}"
    );
}

/// Slurm's output goes through the same line cutting as Docker's: a progress bar's line is its last
/// state, a line longer than 64 KiB keeps its start and says how much was left out.
#[tokio::test(start_paused = true)]
async fn slurm_output_lines_are_their_last_state_and_long_ones_are_cut_with_a_note() {
    let c = Cluster::new();
    let output = vec![
        "\r 10%|#  |\r 50%|## |\r100%|###|".to_string(),
        "z".repeat(100_000),
        "after".to_string(),
    ];
    c.slurm.script(
        "bars",
        Script {
            runtime: Duration::from_secs(5),
            output,
            ..Default::default()
        },
    );
    let e = c.open();
    let _h = run(&e);
    let id = submit(&e, "name: bars\nimage: a\n");
    assert_eq!(final_state(&e, id).await, JobState::Succeeded);
    let shown = String::from_utf8(crate::engine::strip_stamps(&std::fs::read(e.log_of(id)).unwrap())).unwrap();
    let out: Vec<&str> = shown.lines().filter(|l| !l.starts_with("[gantry ")).collect();
    let kept = "z".repeat(64 << 10);
    let note = format!(
        "[gantry] the line above was cut at 64.0 KiB: {} more bytes of it (without a newline) are left out",
        100_000 - (64 << 10)
    );
    assert_eq!(out, vec!["100%|###|", kept.as_str(), note.as_str(), "after"]);
}

/// [`cfg`] with preemption on: the priority rule (a gap of 10), `min_run` 10 minutes.
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

/// A Gantry-decided preemption on Slurm: the queued job 10 above a running preemptible one pends in
/// Slurm for its GPUs; after `min_run` the running one gets its checkpoint signal (`scancel
/// --signal=USR1 --batch`, as its owner), its whole grace (it ignores the signal), then `scontrol
/// requeue`; its attempt ends `preempted` with GPU-minutes (retries: 0 untouched), the urgent job
/// runs on the freed GPUs, and the job's next attempt is the SAME Slurm job run again (restart
/// count 1), not a second `sbatch`.
#[tokio::test(start_paused = true)]
async fn a_preempted_slurm_job_gets_its_signal_then_its_grace_then_scontrol_requeue_and_runs_again_as_the_same_slurm_job(
) {
    let c = Cluster::new();
    c.slurm.script(
        "train",
        Script {
            runtime: Duration::from_secs(3600),
            ..Default::default()
        },
    );
    c.slurm.script(
        "urgent",
        Script {
            runtime: Duration::from_secs(60),
            ..Default::default()
        },
    );
    let e = c.open_with(preempting(c.dir.path()));
    let _h = run(&e);
    let train = submit(
        &e,
        "name: train\nimage: a\ngpus: 4\npreemptible: true\nretries: 0\ncheckpoint: {signal: SIGUSR1, grace: 2m}\n",
    );
    wait_for(&e, train, |s| s == JobState::Running).await;
    let sid = slurm_id(&e, train, 0).unwrap();
    let args = c.slurm.submitted.lock().unwrap()[0].2.clone();
    assert!(
        args.contains(&"--requeue".to_string()) && args.contains(&"--signal=B:USR1@120".to_string()),
        "{args:?}"
    );
    let urgent = submit(&e, "name: urgent\nimage: a\ngpus: 4\npriority: 10\n");
    // Not before min_run (10 min): nothing is signalled yet.
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert!(c.slurm.signals.lock().unwrap().is_empty(), "signalled before min_run");
    let why = e
        .queue()
        .unwrap()
        .into_iter()
        .find(|q| q.job.id == urgent)
        .and_then(|q| q.reason)
        .unwrap_or_default();
    assert!(why.contains("(Resources)"), "{why}");
    assert_eq!(final_state(&e, urgent).await, JobState::Succeeded);
    let signals = c.slurm.signals.lock().unwrap().clone();
    let requeues = c.slurm.requeues.lock().unwrap().clone();
    assert_eq!(
        signals
            .iter()
            .map(|s| (s.0.clone(), s.1.clone(), s.2.clone()))
            .collect::<Vec<_>>(),
        vec![(me().name, sid.to_string(), "USR1".to_string())]
    );
    assert_eq!(
        requeues.iter().map(|r| (r.0.clone(), r.1.clone())).collect::<Vec<_>>(),
        vec![(me().name, sid.to_string())],
        "requeued once, as its owner"
    );
    let grace = requeues[0].2 - signals[0].3;
    assert!(
        grace >= Duration::from_secs(120) && grace <= Duration::from_secs(125),
        "requeued {grace:?} after the signal: the 2m grace, within a poll"
    );
    assert_eq!(final_state(&e, train).await, JobState::Succeeded);
    let d = e.job_detail(train).unwrap();
    assert_eq!(d.attempts.len(), 2, "{:?}", d.attempts);
    assert_eq!(d.attempts[0].reason, Some(EndReason::Preempted));
    let msg = d.attempts[0].message.clone().unwrap_or_default();
    assert!(
        msg.starts_with(&format!(
            "preempted by job {urgent} ({}'s 4-GPU job has priority 10, this one 0) after ",
            me().name
        )) && msg.contains("GPU-minutes · resumes when GPUs free"),
        "{msg}"
    );
    assert_eq!(
        (slurm_id(&e, train, 0), slurm_id(&e, train, 1)),
        (Some(sid), Some(sid)),
        "the requeued Slurm job ran again as the next attempt"
    );
    assert_eq!(c.slurm.restarts(sid), 1);
    let trains = c
        .slurm
        .submitted
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.2.contains(&"--job-name=train".to_string()))
        .count();
    assert_eq!(trains, 1, "one sbatch for train, never a second");
    // The urgent job ran on the GPUs the preemption freed, before train came back.
    let u = e.job_detail(urgent).unwrap();
    // (Slurm's start is in whole seconds; Gantry records the preempted attempt's end at the next
    // `squeue` after the requeue.)
    let (u0, t0) = (u.attempts[0].started_at, &d.attempts[0]);
    assert!(
        u0 >= t0.started_at + 720_000 - 1_000 && u0 + 2_000 >= t0.ended_at.unwrap(),
        "urgent started at the requeue (10 min min_run + the 2m grace), not beside train: {u0} vs {t0:?}"
    );
    assert!(
        d.attempts[1].started_at >= u.attempts[0].started_at,
        "train came back before urgent started"
    );
    let log = std::fs::read_to_string(e.log_of(train)).unwrap();
    assert!(
        log.contains(&format!("requeued Slurm job {sid} (scontrol requeue)"))
            && log.contains("runs again as this attempt (not submitted again)"),
        "{log}"
    );
}

/// A job that saves on its signal and exits within its grace is requeued then, not at the end of
/// the grace (Slurm requeues a finished batch job while it still knows it).
#[tokio::test(start_paused = true)]
async fn a_slurm_job_that_exits_on_its_checkpoint_signal_is_requeued_at_once() {
    let c = Cluster::new();
    c.slurm.script(
        "train",
        Script {
            runtime: Duration::from_secs(3600),
            checkpoint: Some(Duration::from_secs(20)),
            ..Default::default()
        },
    );
    c.slurm.script(
        "urgent",
        Script {
            runtime: Duration::from_secs(60),
            ..Default::default()
        },
    );
    let e = c.open_with(preempting(c.dir.path()));
    let _h = run(&e);
    let train = submit(
        &e,
        "name: train\nimage: a\ngpus: 4\npreemptible: true\ncheckpoint: {signal: SIGUSR1, grace: 10m}\n",
    );
    wait_for(&e, train, |s| s == JobState::Running).await;
    let urgent = submit(&e, "name: urgent\nimage: a\ngpus: 4\npriority: 10\n");
    assert_eq!(final_state(&e, urgent).await, JobState::Succeeded);
    assert_eq!(final_state(&e, train).await, JobState::Succeeded);
    let (signals, requeues) = (
        c.slurm.signals.lock().unwrap().clone(),
        c.slurm.requeues.lock().unwrap().clone(),
    );
    assert_eq!((signals.len(), requeues.len()), (1, 1));
    let after = requeues[0].2 - signals[0].3;
    assert!(
        after >= Duration::from_secs(20) && after <= Duration::from_secs(25),
        "requeued {after:?} after the signal: once it exited, not after the 10m grace"
    );
    let d = e.job_detail(train).unwrap();
    assert_eq!(
        d.attempts.iter().map(|a| a.reason).collect::<Vec<_>>(),
        vec![Some(EndReason::Preempted), Some(EndReason::Exited)]
    );
    assert_eq!(d.attempts[0].slurm_job_id, d.attempts[1].slurm_job_id);
}

/// Slurm's own preemption (PreemptMode=REQUEUE on the cluster): the job goes back to Slurm's queue
/// with its restart count one higher. Gantry records the attempt as `preempted` by Slurm (retries
/// untouched: `retries: 0` and it still succeeds), follows the same Slurm job as the next attempt,
/// and a preemptible job's script maps SLURM_RESTART_COUNT onto GANTRY_RESTART_COUNT.
#[tokio::test(start_paused = true)]
async fn a_requeue_slurm_decided_is_recorded_as_a_preemption_and_the_same_slurm_job_is_followed() {
    let c = Cluster::new();
    c.slurm.script(
        "train",
        Script {
            runtime: Duration::from_secs(600),
            ..Default::default()
        },
    );
    let e = c.open_with(preempting(c.dir.path()));
    let _h = run(&e);
    let train = submit(&e, "name: train\nimage: a\ngpus: 2\npreemptible: true\nretries: 0\n");
    wait_for(&e, train, |s| s == JobState::Running).await;
    let sid = slurm_id(&e, train, 0).unwrap();
    tokio::time::sleep(Duration::from_secs(120)).await;
    c.slurm.slurm_requeue(sid);
    assert_eq!(final_state(&e, train).await, JobState::Succeeded);
    let d = e.job_detail(train).unwrap();
    assert_eq!(d.attempts.len(), 2, "{:?}", d.attempts);
    let a = &d.attempts[0];
    assert_eq!(a.reason, Some(EndReason::Preempted));
    let msg = a.message.clone().unwrap_or_default();
    assert!(msg.starts_with("preempted by Slurm (it requeued the job: the cluster's own preemption, or a node failure) after 4 GPU-minutes"), "{msg}");
    assert_eq!(d.attempts[1].slurm_job_id, Some(sid));
    assert_eq!(d.attempts[1].reason, Some(EndReason::Exited));
    assert!(
        c.slurm.signals.lock().unwrap().is_empty() && c.slurm.requeues.lock().unwrap().is_empty(),
        "Gantry neither signalled nor requeued it"
    );
    assert_eq!(c.slurm.submitted.lock().unwrap().len(), 1, "submitted once");
    // Its usage counts the preempted attempt's GPU-hours.
    let u = e.usage(0).unwrap();
    let mine = u.users.iter().find(|u| u.user == me().name).unwrap();
    assert!(
        (mine.gpu_hours_preempted - 2.0 * 120.0 / 3600.0).abs() < 0.01,
        "{mine:?}"
    );
}
