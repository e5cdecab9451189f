//! The API facade: what clients may ask of the engine.

use std::collections::{BTreeMap, HashMap};
use std::io::{Seek, SeekFrom, Write};

use serde::ser::{SerializeSeq, Serializer};
use serde::Serialize;

use super::{Engine, EngineError, GpuStatus, JobDetail, QueueEntry};
use crate::access::{self, Cred, Forbidden};
use crate::scheduler::{Behind, Waiting};
use crate::spec::{self, SpecError, ValidJob};
use crate::store::{HistoryFilter, HistoryRow, Job, JobState, Owner, QueueJob, QueueSession, QueuedRow, TimelineRun};

impl Engine {
    /// Users who ran `gantry inbox init` (the system engine watches their drop folders).
    pub(crate) fn registered_inboxes(&self) -> Result<Vec<u32>, EngineError> {
        Ok(self.reader().user_inboxes()?)
    }

    pub(crate) fn register_inbox(&self, uid: u32) -> Result<(), EngineError> {
        Ok(self.store().add_user_inbox(uid)?)
    }

    pub fn history_count(&self, f: &HistoryFilter) -> Result<i64, EngineError> {
        Ok(self.reader().history_count(f)?)
    }

    pub fn timeline(&self, from: i64, to: i64) -> Result<Vec<TimelineRun>, EngineError> {
        Ok(self.reader().timeline(from, to)?)
    }

    pub fn gpu_minutes(&self, gpu: u32, from: i64, to: i64) -> Result<Vec<(i64, f64, i64)>, EngineError> {
        Ok(self
            .reader()
            .gpu_minutes(gpu, from)?
            .into_iter()
            .filter(|m| m.0 < to)
            .collect())
    }

    /// " (limits.x in FILE)": where a lab limit comes from, for error messages.
    pub(super) fn set_in(&self, key: &str) -> String {
        match self.lab_file() {
            Some(f) => format!(" ({key} in {})", f.display()),
            None => String::new(),
        }
    }

    /// The lab config file the policy comes from (`None`: the built-in defaults).
    pub fn lab_file(&self) -> Option<&std::path::Path> {
        self.cfg.lab_file.as_deref().filter(|f| f.exists())
    }

    /// Keep the highest job id handed out outside the database too (fixed width, rewritten in place, so
    /// it needs no new disk blocks): ids never restart even if the database loses its WAL.
    pub(super) fn mark_job_id(&self, id: i64) -> Result<(), EngineError> {
        let mut f = self.id_mark.lock().unwrap();
        f.seek(SeekFrom::Start(0))?;
        f.write_all(format!("{id:>20}\n").as_bytes())?;
        Ok(())
    }

    /// Reject jobs the backend can never run (this machine's GPUs; what Slurm can be asked for).
    pub fn check_fits(&self, job: &ValidJob) -> Result<(), SpecError> {
        self.backend.check_fits(self, job)
    }

    /// Check a job's mounts with its owner's permissions (all but `skip`, a path that exists only once
    /// the job is queued: a template's config file).
    pub fn check_mounts(&self, job: &ValidJob, owner: &Owner, skip: Option<&str>) -> Result<(), EngineError> {
        let mounts: Vec<spec::Mount> = job
            .mounts
            .iter()
            .filter(|m| Some(m.host.as_str()) != skip)
            .cloned()
            .collect();
        access::check_mounts(
            &Cred::of_user(owner.uid, owner.gid),
            &mounts,
            job.spec.workdir.as_deref(),
            &self.forbidden(),
        )?;
        Ok(())
    }

    /// What no job may mount: the container engine's sockets and this engine's state.
    pub(super) fn forbidden(&self) -> Forbidden {
        Forbidden::for_engine(
            &self.cfg.paths.state_dir,
            &self.cfg.paths.socket(),
            &self.cfg.paths.inbox,
        )
    }

    pub fn source_known(&self, key: &str) -> Option<i64> {
        self.store().job_by_source_key(key).ok().flatten()
    }

    /// The queue as `gantry ls` and the app show it: starting and running jobs and the queued ones,
    /// by id, each with the scheduler's verdict ([`Engine::queue_json`], read back).
    pub fn queue(&self) -> Result<Vec<QueueEntry>, EngineError> {
        Ok(serde_json::from_slice(&self.queue_json()?).map_err(std::io::Error::from)?)
    }

    /// The queue as the API sends it: a JSON array of [`QueueEntry`]. Written straight from the
    /// queue in memory (only the few started jobs' rows are read from SQLite, without their specs),
    /// so a queue of 100,000 jobs costs no spec parsing and no copy of every row.
    pub fn queue_json(&self) -> Result<Vec<u8>, EngineError> {
        let mut out = vec![];
        self.write_queue(&mut out, &QueueSelect::All)?;
        Ok(out)
    }

    /// `gantry ls`'s page of the queue ([`crate::protocol::QueuePage`] as JSON): every started job,
    /// the first `limit` queued jobs in scheduling order, and the first `limit` of `caller`'s own;
    /// with how many are queued in all. A page of a deep queue costs a walk over the queue in
    /// memory, not 25 MB of JSON.
    pub fn queue_page_json(&self, limit: usize, caller: u32) -> Result<Vec<u8>, EngineError> {
        let mut out = Vec::with_capacity(4096);
        out.extend_from_slice(b"{\"jobs\":");
        let total = self.write_queue(&mut out, &QueueSelect::Page { limit, caller })?;
        out.extend_from_slice(format!(",\"queued\":{total}}}").as_bytes());
        Ok(out)
    }

    /// Write the queue's JSON array (the jobs `select` keeps) to `out`; returns how many jobs are queued.
    fn write_queue(&self, out: &mut Vec<u8>, select: &QueueSelect) -> Result<usize, EngineError> {
        // One snapshot: the queue in memory changes only under the store's lock, with the committed
        // transition it mirrors, so no job is missed or listed twice as it starts.
        let (started, queued) = {
            let mut st = self.store();
            if self.queue.lock().unwrap().is_stale() {
                st.track_queue()?;
            }
            let started = st.started_rows()?;
            let queued = self.queue.lock().unwrap().rows();
            (started, queued)
        };
        // The GPUs each started job holds, so supervisors need not wait for the whole list.
        let (held, stopping): (HashMap<i64, Vec<u32>>, Vec<i64>) = {
            let running = self.running.lock().unwrap();
            let held = started
                .iter()
                .filter_map(|j| running.get(&j.id).map(|h| (j.id, h.gpus.clone())))
                .collect();
            // Being preempted: signalled, saving its checkpoint (shown, not just `running`).
            let stopping = started
                .iter()
                .filter(|j| running.get(&j.id).is_some_and(|h| h.preempt.is_cancelled()))
                .map(|j| j.id)
                .collect();
            (held, stopping)
        };
        let problem = self.health.read().unwrap().store_problem.clone();
        let waiting = self.waiting.read().unwrap();
        let eta = self.eta.read().unwrap();
        let v = Verdicts {
            waiting: &waiting,
            eta: &eta,
            held: &held,
            stopping: &stopping,
            problem: problem.as_deref(),
        };
        if let QueueSelect::All = select {
            out.reserve((started.len() + queued.len()) * QUEUE_ROW_BYTES + 2);
        }
        let (mut own, mut unplaced) = (0usize, 0usize);
        let mut keep = |r: &QueuedRow, w: Option<&Waiting>| match *select {
            QueueSelect::All => true,
            QueueSelect::Page { limit, caller } => {
                let mine = r.owner_uid == caller && own < limit;
                own += usize::from(r.owner_uid == caller);
                // A job the scheduler has not seen yet (just queued) has no position.
                let early = match w {
                    Some(w) => w.position <= limit,
                    None => {
                        unplaced += 1;
                        unplaced <= limit
                    }
                };
                mine || early
            }
        };
        let mut json = serde_json::Serializer::new(&mut *out);
        let mut seq = json.serialize_seq(None).map_err(std::io::Error::from)?;
        // Queued jobs and their verdicts are both by id: walk them side by side (a lookup per job
        // would miss the cache 100,000 times).
        let mut verdicts = waiting.iter().peekable();
        let mut started = started.iter().peekable();
        for r in &queued {
            while let Some(s) = started.next_if(|s| s.id < r.id) {
                seq.serialize_element(&v.started(s)).map_err(std::io::Error::from)?;
            }
            while verdicts.next_if(|(id, _)| **id < r.id).is_some() {}
            let w = verdicts.next_if(|(id, _)| **id == r.id).map(|(_, w)| w);
            if keep(r, w) {
                seq.serialize_element(&v.queued(r, w)).map_err(std::io::Error::from)?;
            }
        }
        for s in started {
            seq.serialize_element(&v.started(s)).map_err(std::io::Error::from)?;
        }
        seq.end().map_err(std::io::Error::from)?;
        Ok(queued.len())
    }

    pub fn job_detail(&self, id: i64) -> Result<JobDetail, EngineError> {
        let st = self.reader();
        let job = st.job(id)?.ok_or(EngineError::NoSuchJob(id))?;
        let reason = self.waiting.read().unwrap().get(&id).map(|w| w.why());
        let efficiency = self.efficiency_of(&st, &job);
        Ok(JobDetail {
            efficiency,
            attempts: st.attempts(id)?,
            events: st.events(id)?,
            job,
            reason,
        })
    }

    /// The job, if `caller_uid` may change it: its owner or an admin.
    pub(crate) fn owned(&self, id: i64, caller_uid: u32) -> Result<Job, EngineError> {
        let job = self.store().job(id)?.ok_or(EngineError::NoSuchJob(id))?;
        if caller_uid != job.owner_uid && !self.policy().is_admin(caller_uid) {
            return Err(EngineError::NotOwner {
                job: id,
                owner: job.owner,
            });
        }
        Ok(job)
    }

    /// Cancel: queued jobs end at once; running ones get SIGTERM, then SIGKILL after the grace period.
    pub fn cancel(&self, id: i64, caller_uid: u32) -> Result<JobState, EngineError> {
        self.owned(id, caller_uid)?;
        let before = self.store().request_cancel(id)?.ok_or(EngineError::NoSuchJob(id))?;
        match before {
            JobState::Queued => {
                self.notify_job(id, JobState::Cancelled);
                // Queued again after a preemption or a failed attempt: its results folder goes now.
                self.remove_results_dir_if_ended(id);
            }
            JobState::Starting | JobState::Running => {
                if let Some(h) = self.running.lock().unwrap().get(&id) {
                    h.cancel.cancel();
                }
            }
            _ => {}
        }
        self.wake.notify_one();
        Ok(before)
    }

    pub fn set_priority(&self, id: i64, priority: i32, caller_uid: u32) -> Result<bool, EngineError> {
        self.owned(id, caller_uid)?;
        let policy = self.policy();
        let (lo, hi) = policy.priority_range(caller_uid);
        if !(lo..=hi).contains(&priority) {
            let key = if policy.is_admin(caller_uid) {
                "limits.admin_priority"
            } else {
                "limits.priority"
            };
            return Err(EngineError::Refused(format!(
                "priority {priority} is outside the range you may use ({lo}..{hi}){}; pick a value from {lo} to {hi}",
                self.set_in(key)
            )));
        }
        let ok = self.store().set_priority(id, priority)?;
        self.wake.notify_one();
        Ok(ok)
    }

    /// Hold (`held`) or release a queued job. Returns false when the job is not queued (or already
    /// in that state).
    pub fn hold(&self, id: i64, held: bool, caller_uid: u32) -> Result<bool, EngineError> {
        self.owned(id, caller_uid)?;
        let ok = self.store().set_held(id, held, &crate::access::user_name(caller_uid))?;
        self.wake.notify_one();
        Ok(ok)
    }

    /// The GPUs view: the backend's GPUs and who holds each one.
    pub fn gpu_status(&self) -> GpuStatus {
        self.backend.gpu_status(self)
    }

    /// May Gantry jobs use this GPU (lab config `gpus`; a MIG instance also when its physical GPU is
    /// listed)?
    pub(super) fn usable(&self, g: &crate::gpu::GpuSample) -> bool {
        self.usable
            .as_ref()
            .is_none_or(|u| u.contains(&g.index) || g.mig_parent.as_ref().is_some_and(|p| u.contains(&p.index)))
    }

    /// GPUs the lab config keeps for interactive use.
    pub fn reserved_gpus(&self) -> Vec<u32> {
        self.latest
            .read()
            .unwrap()
            .iter()
            .filter(|g| !self.usable(g))
            .map(|g| g.index)
            .collect()
    }

    pub fn history(&self, f: &HistoryFilter) -> Result<Vec<HistoryRow>, EngineError> {
        Ok(self.reader().history(f)?)
    }
}

/// Which queued jobs a listing shows.
enum QueueSelect {
    All,
    /// The first `limit` in scheduling order and the first `limit` of `caller`'s.
    Page {
        limit: usize,
        caller: u32,
    },
}

/// What the queue says of each job besides its row.
struct Verdicts<'a> {
    waiting: &'a BTreeMap<i64, Waiting>,
    eta: &'a HashMap<i64, i64>,
    /// The GPUs of each started job.
    held: &'a HashMap<i64, Vec<u32>>,
    /// Running jobs being preempted (their checkpoint signal sent).
    stopping: &'a [i64],
    /// A failed state write: every queued job's reason.
    problem: Option<&'a str>,
}

impl<'a> Verdicts<'a> {
    /// A queued job, with `w` its entry in `waiting` (found by the caller's walk).
    fn queued(&self, r: &'a QueuedRow, w: Option<&'a Waiting>) -> EntryOut<'a> {
        EntryOut {
            job: JobOut::queued(r),
            gpus_assigned: &[],
            position: w.map(|w| w.position),
            reason: Some(match (self.problem, w) {
                (Some(p), _) => Reason::Text(p),
                (None, Some(w)) if w.reason.is_empty() => Reason::Behind(w.position.saturating_sub(1)),
                (None, Some(w)) => Reason::Text(&w.reason),
                (None, None) => Reason::Text("about to be scheduled"),
            }),
            estimated_start: self.eta.get(&r.id).copied(),
            eta_confidence: self.eta.contains_key(&r.id).then_some("p50"),
        }
    }

    fn started(&self, j: &'a QueueJob) -> EntryOut<'a> {
        let w = self.waiting.get(&j.id);
        EntryOut {
            job: JobOut::started(j),
            gpus_assigned: self.held.get(&j.id).map(Vec::as_slice).unwrap_or_default(),
            position: w.map(|w| w.position),
            // The Slurm backend: submitted, waiting in Slurm's queue (Slurm's reason); a running
            // job being preempted says so while it saves.
            reason: match w.filter(|_| j.state == JobState::Starting) {
                Some(w) => Some(Reason::Text(&w.reason)),
                None if self.stopping.contains(&j.id) => Some(Reason::Text(PREEMPTING)),
                None => None,
            },
            estimated_start: None,
            eta_confidence: None,
        }
    }
}

/// A running job's reason while it is being preempted.
const PREEMPTING: &str = "being preempted: got its checkpoint signal, saving; then queued again at its place";

/// About what one queue row takes as JSON (a queued job with a short reason): the buffer is sized
/// once, instead of doubling (and copying) its way to tens of MB.
const QUEUE_ROW_BYTES: usize = 256;

/// One [`QueueEntry`] as [`Engine::queue_json`] writes it, borrowed from the queue in memory. It
/// must serialize exactly as `QueueEntry` does: `Engine::queue` reads this output back as
/// `QueueEntry`s (the engine's tests and the API tests read every field of it).
#[derive(Serialize)]
struct EntryOut<'a> {
    job: JobOut<'a>,
    gpus_assigned: &'a [u32],
    #[serde(skip_serializing_if = "Option::is_none")]
    position: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<Reason<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    estimated_start: Option<i64>,
    /// `p50` with every estimate (see [`QueueEntry::eta_confidence`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    eta_confidence: Option<&'static str>,
}

/// A [`QueueJob`], borrowed.
#[derive(Serialize)]
struct JobOut<'a> {
    id: i64,
    name: &'a str,
    owner_uid: u32,
    owner: &'a str,
    image: &'a str,
    gpus: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_memory: Option<u64>,
    priority: i32,
    state: JobState,
    submitted_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    started_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<std::borrow::Cow<'a, QueueSession>>,
}

impl<'a> JobOut<'a> {
    fn queued(r: &'a QueuedRow) -> Self {
        JobOut {
            id: r.id,
            name: &r.name,
            owner_uid: r.owner_uid,
            owner: &r.owner,
            image: &r.image,
            gpus: r.gpus,
            gpu_memory: r.gpu_memory,
            priority: r.priority,
            state: JobState::Queued,
            submitted_at: r.submitted_at,
            started_at: r.started_at,
            session: r.interactive.then(|| std::borrow::Cow::Owned(QueueSession::default())),
        }
    }
    fn started(j: &'a QueueJob) -> Self {
        // Field by field: a new `QueueJob` field does not compile until it is written here too.
        let QueueJob {
            id,
            name,
            owner_uid,
            owner,
            image,
            gpus,
            gpu_memory,
            priority,
            state,
            submitted_at,
            started_at,
            session,
        } = j;
        JobOut {
            id: *id,
            name,
            owner_uid: *owner_uid,
            owner,
            image,
            gpus: *gpus,
            gpu_memory: *gpu_memory,
            priority: *priority,
            state: *state,
            submitted_at: *submitted_at,
            started_at: *started_at,
            session: session.as_ref().map(std::borrow::Cow::Borrowed),
        }
    }
}

/// Why a job waits: the scheduler's text, or [`Behind`] where the plan wrote none (as
/// [`Waiting::why`] says), written without a string per job.
enum Reason<'a> {
    Text(&'a str),
    Behind(usize),
}

impl Serialize for Reason<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Reason::Text(t) => s.serialize_str(t),
            Reason::Behind(n) => s.collect_str(&Behind(*n)),
        }
    }
}
