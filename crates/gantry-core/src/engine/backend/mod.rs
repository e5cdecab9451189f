//! The seam between the engine and what runs its jobs.
//!
//! The engine owns the loop and every decision about a job's state: it reconciles open attempts
//! after a start, runs a pass, claims each start in SQLite (queued -> starting), supervises each
//! attempt (timeout, cancel, a crashed supervisor) and records its end exactly once through
//! [`crate::outcome`]. A [`Backend`] answers what depends on where jobs run:
//!
//! | phase       | question                                   | Docker (this machine)            | Slurm (a cluster)                      |
//! |-------------|--------------------------------------------|----------------------------------|----------------------------------------|
//! | reconcile   | [`Backend::reconcile`], [`Backend::find`]  | containers found vs attempts     | recorded ids; else the marker, owner's |
//! | pass        | [`Backend::place`]                         | `scheduler::plan` on local GPUs  | every ready job (Slurm places it)      |
//! | supervise   | [`Backend::launch`], [`Backend::watch`]    | create/start; wait, copy logs    | `sbatch`; `squeue`, copy output        |
//! | record end  | [`Backend::release`]                       | remove the container             | nothing left to remove                 |
//! | GPUs view   | [`Backend::sample`], [`Backend::gpu_status`] | NVML (or simulated)            | the nodes' GPUs                        |
//! | submit      | [`Backend::check_fits`]                    | the usable GPUs                  | what `sbatch` can express              |
//! | sessions    | [`Backend::terminal`]                      | the container's TTY (attach)     | none                                   |
//!
//! Cancel and timeout reach the backend through [`Watch::stop`]. The pure decision tables stay in
//! the backends' modules (`docker::reconcile`, `crate::slurm::{seen, resume}`), tested by tables.

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{Engine, EngineError};
use crate::gpu::{GpuError, GpuSample};
use crate::outcome::{How, Stop};
use crate::protocol::GpuStatus;
use crate::scheduler::CpuRam;
use crate::spec::{SpecError, ValidJob};
use crate::store::{Attempt, Job, RunRef};

pub(crate) mod docker;
pub(crate) mod slurm;

/// A queued job to start now, as the backend placed it. The engine claims it (queued -> starting,
/// with a new attempt) and hands the attempt back to [`Backend::launch`].
pub(crate) struct Start {
    pub job: Job,
    /// The GPUs it gets (indexes, UUIDs); empty when the backend picks them later (Slurm).
    pub gpus: Vec<u32>,
    pub gpu_uuids: Vec<String>,
    /// Said in the start event ("attempt 1 on GPU 0 (note)").
    pub note: Option<String>,
    /// Its expected runtime (declared or learned), for the plan's view of when it ends.
    pub runtime: Option<i64>,
    pub placed: Placed,
}

/// What a launch needs besides the job and its attempt.
#[derive(Debug, Clone, Default)]
pub(crate) struct Placed {
    /// Total memory of its first GPU (memory-fraction hints on a shared GPU).
    pub gpu_total: Option<u64>,
    /// The CPU and RAM it is limited to and counted for.
    pub needs: CpuRam,
    /// The runs of the jobs it runs after, where the backend holds it until they succeed (Slurm's
    /// `--dependency=afterok`).
    pub after: Vec<RunRef>,
}

/// What a pass starts.
#[allow(clippy::large_enum_variant)] // a few per pass, moved once into the launch: a box buys nothing
pub(crate) enum Dispatch {
    One(Start),
    /// Launched as one ([`Backend::launch_together`]: a `matrix` as one Slurm job array); each
    /// attempt is then followed on its own.
    Together(Vec<Start>),
}

/// How handing an attempt to the backend went.
pub(crate) enum Launched {
    /// It runs, or waits in the backend's own queue: follow it. `at`: when it was handed over.
    Started { run: RunRef, at: i64 },
    /// It ended before it ran (refused, could not start, cancelled first); `run`: what to remove.
    Ended { how: How, run: Option<RunRef> },
    /// The engine stopped first: recovery finds it on the next start.
    Shutdown,
}

/// Where following an attempt begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Since {
    /// Just launched, at this time (ms): what the backend reported before may not show it yet.
    Launched { at: i64 },
    /// Found running (or waiting in the backend) after an engine restart.
    Recovered,
    /// Found ended after an engine restart: copy what is left of its output, then its end.
    EndedWhileAway,
}

/// An open attempt, as recovery sees it.
pub(crate) struct Open<'a> {
    pub job: &'a Job,
    pub attempt: &'a Attempt,
    /// A supervisor already follows it (recovery after the backend came back).
    pub monitored: bool,
}

/// What recovery does with an open attempt no supervisor follows.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Resumed {
    /// It runs or waits in the backend: follow it again.
    Follow(RunRef),
    /// It ended while the engine was away: copy the rest of its output, record its real end.
    EndedWhileAway(RunRef),
    /// Record this end now (it never started, its run is gone); `run`: what to remove.
    End { how: How, run: Option<RunRef> },
    /// Its run is not recorded but the backend may have it: ask [`Backend::find`] (Slurm: by the
    /// attempt's marker among its owner's jobs).
    Find,
}

/// What a watched attempt did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Seen {
    /// It runs; its timeout counts from `since` (ms).
    Running { since: i64 },
    /// It ended: how (accounting for a stop the supervisor asked for).
    Ended(How),
}

/// One attempt followed to its end. The supervisor owns the loop (timeout, cancel, shutdown); the
/// watcher turns what the backend says into [`Seen`], and copies the output on the way.
#[async_trait::async_trait]
pub(crate) trait Watch: Send {
    /// The next thing worth the supervisor's attention. Cancel-safe: the supervisor drops it to act
    /// on a cancel or a timeout, then asks again. `None`: stop following (the engine stops).
    async fn next(&mut self) -> Option<Seen>;
    /// Stop it (cancel, or the timeout passed). False: not done; the supervisor asks again shortly.
    async fn stop(&mut self, why: Stop) -> bool;
    /// The engine stops: leave it running, finish what is in flight (the output copy).
    async fn detach(&mut self);
}

#[async_trait::async_trait]
pub(crate) trait Backend: Send + Sync + 'static {
    /// What it is called in messages: `Docker`, `Slurm`.
    fn name(&self) -> &'static str;

    /// Before recovery: the backend's own background work (Slurm: the `squeue` tracker), aborted
    /// when the engine stops.
    async fn start(&self, e: &Arc<Engine>) -> Vec<JoinHandle<()>>;

    /// Reconcile (on start, and when the backend comes back): what to do with each open attempt.
    /// Attempts already `monitored` get nothing. A database error is fatal.
    async fn reconcile(&self, e: &Arc<Engine>, open: &[Open<'_>]) -> Result<Vec<(i64, Resumed)>, EngineError>;

    /// For [`Resumed::Find`], in the attempt's supervisor task: what the backend has of it. `None`:
    /// the engine stops first.
    async fn find(&self, e: &Arc<Engine>, job: &Job, attempt: &Attempt) -> Option<Resumed>;

    /// A pass: what starts now. It also says why the others wait (`Engine::waiting`).
    async fn place(&self, e: &Arc<Engine>) -> Vec<Dispatch>;

    /// Hand a claimed attempt to the backend (it then runs, or waits in the backend's own queue).
    async fn launch(
        &self,
        e: &Arc<Engine>,
        job: &Job,
        attempt: &Attempt,
        placed: &Placed,
        cancel: &CancellationToken,
    ) -> Launched;

    /// Several claimed attempts as one launch; by default one after the other.
    async fn launch_together(
        &self,
        e: &Arc<Engine>,
        parts: &[(Job, Attempt, CancellationToken)],
        placed: &Placed,
    ) -> Vec<Launched> {
        let mut out = vec![];
        for (job, attempt, cancel) in parts {
            out.push(self.launch(e, job, attempt, placed, cancel).await);
        }
        out
    }

    /// Where this attempt's `GANTRY_METRICS` file is on this machine (`None`: it has none here).
    fn metrics_file(&self, e: &Engine, job: &Job, attempt: &Attempt, run: &RunRef) -> Option<std::path::PathBuf>;

    /// Follow a launched or recovered attempt.
    fn watch(&self, e: &Arc<Engine>, job: &Job, attempt: &Attempt, run: &RunRef, since: Since) -> Box<dyn Watch>;

    /// Stop it now, without following it (its supervisor crashed).
    async fn abort(&self, e: &Engine, job: &Job, run: &RunRef);

    /// After the attempt's end is committed: remove what is left of it (its container, its pinned
    /// mounts). Never before: recovery needs it to record the end.
    async fn release(&self, e: &Engine, job_id: i64, attempt: &Attempt, run: Option<&RunRef>);

    /// The GPUs, for the sampler and the scheduler.
    fn sample(&self, e: &Engine) -> Result<Vec<GpuSample>, GpuError>;

    /// The GPUs view: the GPUs, who holds each one.
    fn gpu_status(&self, e: &Engine) -> GpuStatus;

    /// At submit: refuse a job this backend can never run, saying why.
    fn check_fits(&self, e: &Engine, job: &ValidJob) -> Result<(), SpecError>;

    /// Said when the engine stops: what happens to what runs.
    fn left_running(&self) -> &'static str;

    /// An interactive session's terminal (`gantry attach`).
    async fn terminal(&self, _run: &RunRef) -> Result<crate::executor::Terminal, EngineError> {
        Err(EngineError::Refused(format!(
            "interactive sessions run on this machine's Docker; the {} backend has no terminal to attach to",
            self.name()
        )))
    }

    /// Set the size of a session's terminal.
    async fn resize_terminal(&self, _run: &RunRef, _cols: u16, _rows: u16) -> Result<(), EngineError> {
        Ok(())
    }

    /// A connection to `port` inside the job's container (`gantry open`).
    async fn connect_port(&self, _run: &RunRef, _port: u16) -> Result<tokio::net::TcpStream, EngineError> {
        Err(EngineError::Refused(format!(
            "the {} backend cannot reach a job's ports",
            self.name()
        )))
    }

    /// The attempt's MLflow endpoint: a listener on 127.0.0.1 inside the job's own network namespace,
    /// on the port its environment names, and the token its client sends (`results::mlflow`).
    /// `None`: this backend gives its jobs none (Slurm), or the spec names its own tracking server.
    async fn mlflow_listener(
        &self,
        _job: &Job,
        _run: &RunRef,
    ) -> Result<Option<(std::net::TcpListener, String)>, EngineError> {
        Ok(None)
    }
}
