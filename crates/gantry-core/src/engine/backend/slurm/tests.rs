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
    c.lab.slurm = Settings { poll: Duration::from_secs(1), log_dir: Some(logs), ..Default::default() };
    c
}

/// Jobs run as the test's own user: Slurm's output must be a file its owner owns, and only root may
/// hand files to someone else.
fn me() -> Owner {
    let uid = nix::unistd::geteuid();
    let user = nix::unistd::User::from_uid(uid).unwrap().expect("the test's user has a passwd entry");
    Owner { uid: uid.as_raw(), gid: nix::unistd::getegid().as_raw(), name: user.name }
}

struct Cluster {
    dir: tempfile::TempDir,
    clock: Arc<dyn Clock>,
    slurm: Arc<FakeSlurm>,
}

impl Cluster {
    fn new() -> Cluster {
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
        Cluster { dir: tempfile::tempdir().unwrap(), slurm: FakeSlurm::new(clock.clone()), clock }
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
    let spec = crate::engine::submit::Spec::File { text: yaml, file_name: "test.yaml", base_dir: None };
    e.submit(crate::engine::submit::Submission { spec, owner: &me(), source: "test".into(), source_key: None, idempotency_key: None }).unwrap()[0]
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
    c.slurm.script("train", Script { runtime: Duration::from_secs(60), ..Default::default() });
    c.slurm.script("adopted", Script { runtime: Duration::from_secs(30), ..Default::default() });
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
        e.store().begin_attempt_noted(id, &[], &[], Some("submitting to Slurm")).unwrap().unwrap();
    }
    let mine = c.slurm.inject(me().uid, "adopted", &marker(&e.db_uid, adopted, 1));
    // Anyone may put any comment on their own Slurm job: another user's job with the marker.
    let theirs = c.slurm.inject(me().uid + 1, "forged", &marker(&e.db_uid, forged, 1));
    let before = c.slurm.submitted.lock().unwrap().len();
    let _h = run(&e);

    assert_eq!(final_state(&e, followed).await, JobState::Succeeded);
    assert_eq!(final_state(&e, adopted).await, JobState::Succeeded);
    assert_eq!(final_state(&e, forged).await, JobState::Succeeded);
    assert_eq!(e.job_detail(followed).unwrap().attempts.len(), 1, "followed again, not run again");
    let a = e.job_detail(adopted).unwrap();
    assert_eq!((a.attempts.len(), a.attempts[0].slurm_job_id), (1, Some(mine)), "adopted: its own Slurm job, recorded");
    let f = e.job_detail(forged).unwrap();
    assert_eq!(f.attempts.len(), 2, "the first attempt never reached Slurm; the job is submitted again");
    assert_eq!(f.attempts[0].reason, Some(EndReason::Lost));
    assert_ne!(slurm_id(&e, forged, 1), Some(theirs), "another user's job is never adopted");
    let submitted: Vec<u64> = c.slurm.submitted.lock().unwrap()[before..].iter().map(|s| s.1).collect();
    assert_eq!(submitted, vec![slurm_id(&e, forged, 1).unwrap()], "after the restart only the forged one's job went to Slurm, once");
    assert!(std::fs::read_to_string(e.log_of(adopted)).unwrap().contains(&format!("found as Slurm job {mine} after an engine restart (not submitted again)")));
}

/// Cancel is `scancel` as the job's owner, running or still pending in Slurm.
#[tokio::test(start_paused = true)]
async fn cancel_scancels_as_the_owner_whether_it_runs_or_pends() {
    let c = Cluster::new();
    c.slurm.script("long", Script { runtime: Duration::from_secs(3600), ..Default::default() });
    c.slurm.script("waits", Script { pending: Duration::from_secs(3600), ..Default::default() });
    let e = c.open();
    let _h = run(&e);
    let running = submit(&e, "name: long\nimage: a\n");
    let pending = submit(&e, "name: waits\nimage: a\n");
    wait_for(&e, running, |s| s == JobState::Running).await;
    while slurm_id(&e, pending, 0).is_none() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let why = e.queue().unwrap().into_iter().find(|q| q.job.id == pending).and_then(|q| q.reason).unwrap_or_default();
    assert!(why.contains("waiting for GPUs, CPUs or memory to free up in Slurm (Resources)"), "{why}");
    e.cancel(running, me().uid).unwrap();
    e.cancel(pending, me().uid).unwrap();
    assert_eq!(final_state(&e, running).await, JobState::Cancelled);
    assert_eq!(final_state(&e, pending).await, JobState::Cancelled);
    let r = &e.job_detail(running).unwrap().attempts[0];
    assert_eq!((r.reason, r.exit_code), (Some(EndReason::Cancelled), Some(143)));
    let p = &e.job_detail(pending).unwrap().attempts[0];
    assert!(p.message.as_deref().unwrap_or("").contains("before it started"), "{:?}", p.message);
    let mut cancels = c.slurm.cancels.lock().unwrap().clone();
    cancels.sort();
    let mut want = vec![(me().name, slurm_id(&e, running, 0).unwrap().to_string()), (me().name, slurm_id(&e, pending, 0).unwrap().to_string())];
    want.sort();
    assert_eq!(cancels, want);
}

/// Gantry's own timeout counts from when Slurm started the job (not from the submit), and is a
/// `scancel`; a timeout is never retried.
#[tokio::test(start_paused = true)]
async fn the_timeout_counts_from_slurms_start_and_is_never_retried() {
    let c = Cluster::new();
    c.slurm.script("slow", Script { pending: Duration::from_secs(20), runtime: Duration::from_secs(3600), ..Default::default() });
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
    assert!(a.started_at - d.job.submitted_at >= 19_000, "started {} ms after the submit: the 20 s pending is not counted", a.started_at - d.job.submitted_at);
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
    c.slurm.script("talks", Script { runtime: Duration::from_secs(5), output: lines.clone(), ..Default::default() });
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
    assert_eq!(log.matches("[gantry] log truncated: the job wrote more than 1000 bytes").count(), 1, "{log}");
    let copied: Vec<&str> = log.lines().filter(|l| l.starts_with("line ")).collect();
    assert!(!copied.is_empty() && copied.len() < 100 && copied[..] == lines[..copied.len()], "the start of the output, then the note:\n{log}");
    let note = log.find("log truncated").unwrap();
    assert!(!log[note..].contains("line "), "nothing of the output after the note:\n{log}");
}

/// Slurm's output goes through the same line cutting as Docker's: a progress bar's line is its last
/// state, a line longer than 64 KiB keeps its start and says how much was left out.
#[tokio::test(start_paused = true)]
async fn slurm_output_lines_are_their_last_state_and_long_ones_are_cut_with_a_note() {
    let c = Cluster::new();
    let output = vec!["\r 10%|#  |\r 50%|## |\r100%|###|".to_string(), "z".repeat(100_000), "after".to_string()];
    c.slurm.script("bars", Script { runtime: Duration::from_secs(5), output, ..Default::default() });
    let e = c.open();
    let _h = run(&e);
    let id = submit(&e, "name: bars\nimage: a\n");
    assert_eq!(final_state(&e, id).await, JobState::Succeeded);
    let shown = String::from_utf8(crate::engine::strip_stamps(&std::fs::read(e.log_of(id)).unwrap())).unwrap();
    let out: Vec<&str> = shown.lines().filter(|l| !l.starts_with("[gantry ")).collect();
    let kept = "z".repeat(64 << 10);
    let note = format!("[gantry] the line above was cut at 64.0 KiB: {} more bytes of it (without a newline) are left out", 100_000 - (64 << 10));
    assert_eq!(out, vec!["100%|###|", kept.as_str(), note.as_str(), "after"]);
}
