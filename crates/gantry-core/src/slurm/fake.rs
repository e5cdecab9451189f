//! An in-process Slurm cluster for unit tests of the engine's Slurm backend under
//! `tokio::time::pause`: jobs pend, run and end on a scripted timeline (tokio's clock), write their
//! scripted output where `--output=` says, and answer `scancel` as Slurm does (only their owner).
//! One node, `fake1`, with a few GPUs. No job arrays.

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
}

impl Default for Script {
    fn default() -> Self {
        Script { pending: Duration::ZERO, runtime: Duration::from_secs(1), code: 0, output: vec![] }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Pending,
    Running,
    /// Slurm's state and the raw wait status (`code << 8`, or the signal).
    Ended { state: &'static str, status: i64 },
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
        })
    }

    pub fn script(&self, job_name: &str, s: Script) {
        self.scripts.lock().unwrap().insert(job_name.into(), s);
    }

    /// A job someone submitted outside this engine (`sbatch --comment=…` by `uid`).
    pub fn inject(&self, uid: u32, name: &str, comment: &str) -> u64 {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let script = self.scripts.lock().unwrap().get(name).cloned().unwrap_or_default();
        let job = FakeJob { uid, name: name.into(), comment: comment.into(), output: None, gpus: 0, script, submitted: Instant::now(), phase: Phase::Pending, start_s: None };
        self.jobs.lock().unwrap().insert(id, job);
        id
    }

    /// Slurm's state of job `id` now (`None`: no such job).
    pub fn state(&self, id: u64) -> Option<String> {
        let mut jobs = self.jobs.lock().unwrap();
        let j = jobs.get_mut(&id)?;
        self.settle(j);
        Some(state_of(&j.phase).0.to_string())
    }

    fn up(&self) -> Result<(), SlurmError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(SlurmError::Unavailable("squeue: error: Unable to contact slurm controller (fake Slurm is down)".into()));
        }
        Ok(())
    }

    /// Move a job along its script to now.
    fn settle(&self, j: &mut FakeJob) {
        let elapsed = j.submitted.elapsed();
        if j.phase == Phase::Pending && elapsed >= j.script.pending {
            let since_start = elapsed - j.script.pending;
            j.start_s = Some((self.clock.now_ms() - since_start.as_millis() as i64) / 1000);
            j.phase = Phase::Running;
            if let Some(p) = &j.output {
                let mut f = std::fs::OpenOptions::new().create(true).append(true).open(p).expect("the fake job's output file");
                for l in &j.script.output {
                    writeln!(f, "{l}").expect("write the fake job's output");
                }
            }
        }
        if j.phase == Phase::Running && elapsed >= j.script.pending + j.script.runtime {
            let state = if j.script.code == 0 { "COMPLETED" } else { "FAILED" };
            j.phase = Phase::Ended { state, status: j.script.code << 8 };
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
            nodes: j.start_s.map(|_| "fake1".to_string()),
            gres_detail: if running && j.gpus > 0 { vec![format!("gpu:{}(IDX:0-{})", j.gpus, j.gpus - 1)] } else { vec![] },
            array_job_id: Value::Null,
            array_task_id: Value::Null,
            array_task_string: String::new(),
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
        let gpus = arg(args, "--gres=gpu:").and_then(|g| g.rsplit(':').next()?.parse().ok()).unwrap_or(0);
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
        };
        self.jobs.lock().unwrap().insert(id, job);
        self.submitted.lock().unwrap().push((who.name.clone(), id, args.to_vec()));
        Ok(id)
    }

    async fn queue(&self) -> Result<Vec<SqJob>, SlurmError> {
        self.up()?;
        let mut jobs = self.jobs.lock().unwrap();
        Ok(jobs
            .iter_mut()
            .map(|(id, j)| {
                self.settle(j);
                Self::sq(*id, j)
            })
            .collect())
    }

    async fn cancel(&self, who: &As, target: &str) -> Result<(), SlurmError> {
        self.up()?;
        let id: u64 = target.parse().map_err(|_| SlurmError::Rejected(format!("scancel: error: Invalid job id {target}")))?;
        let mut jobs = self.jobs.lock().unwrap();
        let j = jobs.get_mut(&id).ok_or_else(|| SlurmError::Rejected(format!("scancel: error: Kill job error on job id {id}: Invalid job id specified")))?;
        if j.uid != who.uid && who.uid != 0 {
            return Err(SlurmError::Rejected(format!("scancel: error: Kill job error on job id {id}: Access/permission denied")));
        }
        self.settle(j);
        match j.phase {
            Phase::Pending => j.phase = Phase::Ended { state: "CANCELLED", status: 0 },
            Phase::Running => j.phase = Phase::Ended { state: "CANCELLED", status: 15 },
            Phase::Ended { .. } => {}
        }
        self.cancels.lock().unwrap().push((who.name.clone(), target.into()));
        Ok(())
    }

    async fn nodes(&self) -> Result<Vec<Node>, SlurmError> {
        self.up()?;
        Ok(vec![Node { name: "fake1".into(), state: "IDLE".into(), gpus: 4, gpu_type: None, gpus_used: vec![] }])
    }

    async fn jobcomp_log(&self) -> Option<PathBuf> {
        None
    }
}
