//! An in-process Slurm cluster for unit tests of the engine's Slurm backend under
//! `tokio::time::pause`: jobs pend, run and end on a scripted timeline (tokio's clock), write their
//! scripted output where `--output=` says, and answer `scancel` as Slurm does (only their owner).
//! One node, `fake1`, with 4 GPUs: a job pends (`Resources`) while the running ones hold too many
//! of them. `scancel --signal` and `scontrol requeue` behave as Slurm's (a requeued job waits
//! [`REQUEUE_DELAY`], `BeginTime`, then runs again with its restart count one higher). No job arrays.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use super::{As, Node, SlurmClient, SlurmError, SqJob};
use crate::clock::Clock;

/// How a fake Slurm job behaves, chosen by its `--job-name`.
#[derive(Debug, Clone)]
pub struct Script {
    /// Pending (reason `Resources`) this long after submission.
    pub pending: Duration,
    pub runtime: Duration,
    pub code: i64,
    /// Written to its output file when it starts.
    pub output: Vec<String>,
    /// After a signal (`scancel --signal`) it saves for this long and exits 0; `None`: it ignores signals.
    pub checkpoint: Option<Duration>,
}

impl Default for Script {
    fn default() -> Self {
        Script {
            pending: Duration::ZERO,
            runtime: Duration::from_secs(1),
            code: 0,
            output: vec![],
            checkpoint: None,
        }
    }
}

/// The node's GPUs.
pub const FAKE_GPUS: u32 = 4;
/// How long a requeued job waits before it may start again (Slurm: `BeginTime`, about 2 minutes).
pub const REQUEUE_DELAY: Duration = Duration::from_secs(121);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Pending,
    Running,
    /// Slurm's state and the raw wait status (`code << 8`, or the signal).
    Ended {
        state: &'static str,
        status: i64,
    },
}

struct FakeJob {
    uid: u32,
    name: String,
    comment: String,
    output: Option<PathBuf>,
    gpus: u32,
    script: Script,
    submitted: Instant,
    phase: Phase,
    /// Its start on the engine's clock (s), once it runs.
    start_s: Option<i64>,
    /// Its run started at (tokio's clock), and when it ends (its runtime, or its checkpoint after a signal).
    started: Option<Instant>,
    ends: Option<Instant>,
    restarts: u32,
}

pub struct FakeSlurm {
    clock: Arc<dyn Clock>,
    scripts: Mutex<HashMap<String, Script>>,
    jobs: Mutex<BTreeMap<u64, FakeJob>>,
    next: AtomicU64,
    pub down: AtomicBool,
    /// Every `sbatch`: (as whom, the id it got, its arguments).
    pub submitted: Mutex<Vec<(String, u64, Vec<String>)>>,
    /// Every `scancel` that went through: (as whom, its target).
    pub cancels: Mutex<Vec<(String, String)>>,
    /// Every `scancel --signal` that went through: (as whom, its target, the signal, when).
    pub signals: Mutex<Vec<(String, String, String, Instant)>>,
    /// Every `scontrol requeue` that went through: (as whom, its target, when).
    pub requeues: Mutex<Vec<(String, String, Instant)>>,
    /// When a requeue or a cancel last freed GPUs (a job held back by them starts no earlier).
    freed: Mutex<Option<Instant>>,
}

impl FakeSlurm {
    /// Start times are read from `clock` (the engine's), as Slurm's own clock would be.
    pub fn new(clock: Arc<dyn Clock>) -> Arc<FakeSlurm> {
        Arc::new(FakeSlurm {
            clock,
            scripts: Mutex::default(),
            jobs: Mutex::default(),
            next: AtomicU64::new(100),
            down: AtomicBool::new(false),
            submitted: Mutex::default(),
            cancels: Mutex::default(),
            signals: Mutex::default(),
            requeues: Mutex::default(),
            freed: Mutex::default(),
        })
    }

    pub fn script(&self, job_name: &str, s: Script) {
        self.scripts.lock().unwrap().insert(job_name.into(), s);
    }

    /// A job someone submitted outside this engine (`sbatch --comment=…` by `uid`).
    pub fn inject(&self, uid: u32, name: &str, comment: &str) -> u64 {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let script = self.scripts.lock().unwrap().get(name).cloned().unwrap_or_default();
        let job = FakeJob {
            uid,
            name: name.into(),
            comment: comment.into(),
            output: None,
            gpus: 0,
            script,
            submitted: Instant::now(),
            phase: Phase::Pending,
            start_s: None,
            started: None,
            ends: None,
            restarts: 0,
        };
        self.jobs.lock().unwrap().insert(id, job);
        id
    }

    /// Slurm's state of job `id` now (`None`: no such job).
    pub fn state(&self, id: u64) -> Option<String> {
        let mut jobs = self.jobs.lock().unwrap();
        self.settle_all(&mut jobs);
        Some(state_of(&jobs.get(&id)?.phase).0.to_string())
    }

    fn up(&self) -> Result<(), SlurmError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(SlurmError::Unavailable(
                "squeue: error: Unable to contact slurm controller (fake Slurm is down)".into(),
            ));
        }
        Ok(())
    }

    /// Slurm requeued job `id` itself (PreemptMode=REQUEUE on the cluster): back to pending, its
    /// restart count one higher.
    pub fn slurm_requeue(&self, id: u64) {
        let mut jobs = self.jobs.lock().unwrap();
        let j = jobs.get_mut(&id).expect("a fake job");
        Self::requeue_job(j);
        *self.freed.lock().unwrap() = Some(Instant::now());
    }

    /// Its restart count.
    pub fn restarts(&self, id: u64) -> u32 {
        self.jobs.lock().unwrap().get(&id).map(|j| j.restarts).unwrap_or(0)
    }

    fn requeue_job(j: &mut FakeJob) {
        j.phase = Phase::Pending;
        j.submitted = Instant::now();
        j.script.pending = REQUEUE_DELAY;
        j.start_s = None;
        j.started = None;
        j.ends = None;
        j.restarts += 1;
    }

    /// Move every job along its script to now: ends first (they free GPUs), then starts in id order
    /// while the node's GPUs allow.
    fn settle_all(&self, jobs: &mut BTreeMap<u64, FakeJob>) {
        let now = Instant::now();
        for j in jobs.values_mut() {
            if j.phase == Phase::Running && j.ends.is_some_and(|e| now >= e) {
                let state = if j.script.code == 0 || j.ends != j.started.map(|s| s + j.script.runtime) {
                    "COMPLETED"
                } else {
                    "FAILED"
                };
                let code = if state == "COMPLETED" { 0 } else { j.script.code };
                j.phase = Phase::Ended {
                    state,
                    status: code << 8,
                };
            }
        }
        let mut used: u32 = jobs
            .values()
            .filter(|j| j.phase == Phase::Running)
            .map(|j| j.gpus)
            .sum();
        // GPUs freed last when the latest run ended (a job held back by them starts no earlier).
        let freed = jobs
            .values()
            .filter(|j| matches!(j.phase, Phase::Ended { .. }))
            .filter_map(|j| j.ends)
            .filter(|e| *e <= now)
            .chain(*self.freed.lock().unwrap())
            .max();
        for j in jobs.values_mut() {
            if j.phase != Phase::Pending || j.submitted.elapsed() < j.script.pending || used + j.gpus > FAKE_GPUS {
                continue;
            }
            used += j.gpus;
            // It could start when its pending time passed; a job held back by GPUs starts now.
            let at = freed
                .map_or(j.submitted + j.script.pending, |f| {
                    f.max(j.submitted + j.script.pending)
                })
                .min(now);
            let since_start = now - at;
            j.start_s = Some((self.clock.now_ms() - since_start.as_millis() as i64) / 1000);
            j.started = Some(at);
            j.ends = Some(at + j.script.runtime);
            j.phase = Phase::Running;
            if let Some(p) = &j.output {
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .expect("the fake job's output file");
                for l in &j.script.output {
                    writeln!(f, "{l}").expect("write the fake job's output");
                }
            }
            // A short job may have ended already.
            if j.ends.is_some_and(|e| now >= e) {
                let state = if j.script.code == 0 { "COMPLETED" } else { "FAILED" };
                j.phase = Phase::Ended {
                    state,
                    status: j.script.code << 8,
                };
            }
        }
    }

    fn sq(id: u64, j: &FakeJob) -> SqJob {
        let (state, reason, status) = state_of(&j.phase);
        let running = matches!(j.phase, Phase::Running);
        SqJob {
            job_id: id,
            job_state: Value::String(state.into()),
            state_reason: reason.into(),
            exit_code: status.map(|s| json!(s)).unwrap_or(Value::Null),
            comment: Some(j.comment.clone()),
            name: j.name.clone(),
            user_name: None,
            user_id: json!(j.uid),
            start_time: json!(j.start_s.unwrap_or(0)),
            nodes: running.then(|| "fake1".to_string()),
            gres_detail: if running && j.gpus > 0 {
                vec![format!("gpu:{}(IDX:0-{})", j.gpus, j.gpus - 1)]
            } else {
                vec![]
            },
            array_job_id: Value::Null,
            array_task_id: Value::Null,
            array_task_string: String::new(),
            restart_cnt: json!(j.restarts),
        }
    }
}

fn state_of(p: &Phase) -> (&'static str, &'static str, Option<i64>) {
    match p {
        Phase::Pending => ("PENDING", "Resources", None),
        Phase::Running => ("RUNNING", "None", None),
        Phase::Ended { state, status, .. } => (state, "None", Some(*status)),
    }
}

fn arg<'a>(args: &'a [String], key: &str) -> Option<&'a str> {
    args.iter().find_map(|a| a.strip_prefix(key))
}

#[async_trait::async_trait]
impl SlurmClient for FakeSlurm {
    async fn submit(&self, who: &As, args: &[String], _script: &str) -> Result<u64, SlurmError> {
        self.up()?;
        if arg(args, "--array=").is_some() {
            return Err(SlurmError::Rejected("the fake Slurm runs no job arrays".into()));
        }
        let name = arg(args, "--job-name=").unwrap_or("sbatch").to_string();
        let gpus = arg(args, "--gres=gpu:")
            .and_then(|g| g.rsplit(':').next()?.parse().ok())
            .unwrap_or(0);
        let script = self.scripts.lock().unwrap().get(&name).cloned().unwrap_or_default();
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let job = FakeJob {
            uid: who.uid,
            name,
            comment: arg(args, "--comment=").unwrap_or("").into(),
            output: arg(args, "--output=").map(PathBuf::from),
            gpus,
            script,
            submitted: Instant::now(),
            phase: Phase::Pending,
            start_s: None,
            started: None,
            ends: None,
            restarts: 0,
        };
        self.jobs.lock().unwrap().insert(id, job);
        self.submitted
            .lock()
            .unwrap()
            .push((who.name.clone(), id, args.to_vec()));
        Ok(id)
    }

    async fn queue(&self) -> Result<Vec<SqJob>, SlurmError> {
        self.up()?;
        let mut jobs = self.jobs.lock().unwrap();
        self.settle_all(&mut jobs);
        Ok(jobs.iter().map(|(id, j)| Self::sq(*id, j)).collect())
    }

    async fn cancel(&self, who: &As, target: &str) -> Result<(), SlurmError> {
        self.up()?;
        let id: u64 = target
            .parse()
            .map_err(|_| SlurmError::Rejected(format!("scancel: error: Invalid job id {target}")))?;
        let mut jobs = self.jobs.lock().unwrap();
        self.settle_all(&mut jobs);
        let j = jobs.get_mut(&id).ok_or_else(|| {
            SlurmError::Rejected(format!(
                "scancel: error: Kill job error on job id {id}: Invalid job id specified"
            ))
        })?;
        if j.uid != who.uid && who.uid != 0 {
            return Err(SlurmError::Rejected(format!(
                "scancel: error: Kill job error on job id {id}: Access/permission denied"
            )));
        }
        match j.phase {
            Phase::Pending => {
                j.phase = Phase::Ended {
                    state: "CANCELLED",
                    status: 0,
                }
            }
            Phase::Running => {
                j.phase = Phase::Ended {
                    state: "CANCELLED",
                    status: 15,
                };
                *self.freed.lock().unwrap() = Some(Instant::now());
            }
            Phase::Ended { .. } => {}
        }
        self.cancels.lock().unwrap().push((who.name.clone(), target.into()));
        Ok(())
    }

    async fn signal(&self, who: &As, target: &str, signal: &str) -> Result<(), SlurmError> {
        self.up()?;
        let id: u64 = target
            .parse()
            .map_err(|_| SlurmError::Rejected(format!("scancel: error: Invalid job id {target}")))?;
        let mut jobs = self.jobs.lock().unwrap();
        self.settle_all(&mut jobs);
        let j = jobs
            .get_mut(&id)
            .ok_or_else(|| SlurmError::Rejected(format!("scancel: error: Invalid job id {id}")))?;
        if j.uid != who.uid && who.uid != 0 {
            return Err(SlurmError::Rejected(format!(
                "scancel: error: Signal job error on job id {id}: Access/permission denied"
            )));
        }
        if j.phase != Phase::Running {
            return Err(SlurmError::Rejected(format!(
                "scancel: error: Signal job error on job id {id}: Job is not running"
            )));
        }
        if let Some(c) = j.script.checkpoint {
            let at = Instant::now() + c;
            j.ends = Some(j.ends.map_or(at, |e| e.min(at)));
        }
        self.signals
            .lock()
            .unwrap()
            .push((who.name.clone(), target.into(), signal.into(), Instant::now()));
        Ok(())
    }

    async fn requeue(&self, who: &As, target: &str) -> Result<(), SlurmError> {
        self.up()?;
        let id: u64 = target
            .parse()
            .map_err(|_| SlurmError::Rejected(format!("scontrol: error: Invalid job id {target}")))?;
        let mut jobs = self.jobs.lock().unwrap();
        self.settle_all(&mut jobs);
        let j = jobs
            .get_mut(&id)
            .ok_or_else(|| SlurmError::Rejected(format!("Requeue job {id} failed: Invalid job id specified")))?;
        if j.uid != who.uid && who.uid != 0 {
            return Err(SlurmError::Rejected(format!(
                "Requeue job {id} failed: Access/permission denied"
            )));
        }
        // Slurm requeues a running or finished batch job, not one still pending.
        if j.phase == Phase::Pending {
            return Err(SlurmError::Rejected(format!(
                "Requeue job {id} failed: Job is pending execution"
            )));
        }
        Self::requeue_job(j);
        *self.freed.lock().unwrap() = Some(Instant::now());
        self.requeues
            .lock()
            .unwrap()
            .push((who.name.clone(), target.into(), Instant::now()));
        Ok(())
    }

    async fn nodes(&self) -> Result<Vec<Node>, SlurmError> {
        self.up()?;
        Ok(vec![Node {
            name: "fake1".into(),
            state: "IDLE".into(),
            gpus: FAKE_GPUS,
            gpu_type: None,
            gpus_used: vec![],
        }])
    }

    async fn jobcomp_log(&self) -> Option<PathBuf> {
        None
    }
}
