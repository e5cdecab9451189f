//! The Docker backend: Gantry places jobs on this machine's GPUs (`scheduler::plan`) and runs each
//! attempt as a container through an [`Executor`] (bollard, or `FakeExecutor` in tests).

mod gpus;
mod logs;
mod pulls;
mod reconcile;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, RwLock};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Backend, Dispatch, Launched, Open, Placed, Resumed, Since, Watch};
use crate::access::{self, Cred};
use crate::config::FOREIGN_IDLE_EVERY_MS;
use crate::engine::{append_log, gpu_list, Engine, EngineError};
use crate::executor::{ExecError, Executor, ForeignGpuUse, GpuBinding, Launch};
use crate::gpu::{BackendKind, GpuError, GpuSample};
use crate::outcome::How;
use crate::protocol::GpuStatus;
use crate::resources::{ContainerSettings, FALLBACK_HOME};
use crate::spec::{SpecError, ValidJob};
use crate::store::{Attempt, Job, JobState, RunRef};

pub(crate) struct DockerBackend {
    exec: Arc<dyn Executor>,
    /// Running containers of other engines (or anyone's `docker run --gpus`) and the GPUs they hold.
    foreign: RwLock<Vec<ForeignGpuUse>>,
    /// When they were last listed (ms).
    foreign_at: AtomicI64,
    /// Images being pulled for queued jobs (before they are placed).
    pulls: pulls::Pulls,
    /// Docker's storage, once `docker info` answered.
    storage: RwLock<Option<crate::executor::Storage>>,
    /// The storage driver bounds a container's writable layer (`--storage-opt size`).
    layer_ok: std::sync::atomic::AtomicBool,
    /// When Docker's free space was last looked at (ms).
    disk_at: AtomicI64,
    /// Since when each GPU has been used outside this engine without a break (`GpuView::outside_since_ms`).
    outside_since: std::sync::Mutex<std::collections::HashMap<u32, i64>>,
    /// Containers' output attached before their start, until their watch takes it (by container id).
    attached: std::sync::Mutex<std::collections::HashMap<String, logs::Attached>>,
}

impl DockerBackend {
    pub fn new(exec: Arc<dyn Executor>) -> DockerBackend {
        DockerBackend {
            exec,
            foreign: RwLock::new(vec![]),
            foreign_at: AtomicI64::new(0),
            pulls: Default::default(),
            storage: RwLock::new(None),
            layer_ok: Default::default(),
            disk_at: AtomicI64::new(i64::MIN / 2),
            outside_since: Default::default(),
            attached: Default::default(),
        }
    }

    /// Is Docker reachable? Its problem goes to `Health::backend_problem`; when it comes back, open
    /// attempts are reconciled again (their containers may have changed meanwhile).
    async fn ping(&self, e: &Arc<Engine>) -> Option<String> {
        match self.exec.ping().await {
            Ok(()) => {
                if e.health.write().unwrap().backend_problem.take().is_some() {
                    info!("Docker engine is back");
                    let e2 = e.clone();
                    e.tasks.spawn(async move {
                        if let Err(err) = e2.clone().recover().await {
                            e2.fatal(err);
                        }
                    });
                }
                None
            }
            Err(err) => {
                let msg = err.to_string();
                let mut h = e.health.write().unwrap();
                if h.backend_problem.is_none() {
                    warn!("{msg}");
                }
                h.backend_problem = Some(msg.clone());
                Some(msg)
            }
        }
    }

    /// Never two engines on the same GPUs: what others' containers hold counts as busy. A failed
    /// list keeps the last one (`quiet`: Docker trouble is reported elsewhere).
    async fn list_foreign(&self, e: &Engine, quiet: bool) {
        match self.exec.foreign_gpu_users(&e.engine_id).await {
            Ok(f) => {
                self.foreign_at.store(e.now(), Ordering::Relaxed);
                *self.foreign.write().unwrap() = f
            }
            Err(err) if !quiet => warn!("cannot list other containers' GPUs: {err}"),
            Err(_) => {}
        }
    }
}

/// Free and total bytes of the file system holding `path` (`None`: not on this machine).
fn free_space(path: &str) -> Option<(u64, u64)> {
    let c = std::ffi::CString::new(path).ok()?;
    // SAFETY: statvfs into a zeroed struct through a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let f = st.f_frsize as u64;
    Some((st.f_bavail as u64 * f, st.f_blocks as u64 * f))
}

/// The mount options of the file system holding `path` (the longest mount point above it).
fn mount_options(path: &str) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let under = |m: &str| m == "/" || path == m || path.starts_with(&format!("{m}/"));
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() >= 4 && under(f[1])).then(|| (f[1].len(), f[3].to_string()))
        })
        .max_by_key(|(n, _)| *n)
        .map(|(_, o)| o)
}

impl DockerBackend {
    /// Docker's storage and whether it bounds writable layers (asked once `docker info` answers).
    async fn storage(&self) -> Option<crate::executor::Storage> {
        if let Some(s) = self.storage.read().unwrap().clone() {
            return Some(s);
        }
        let s = self.exec.storage().await.ok().flatten()?;
        let ok =
            crate::policy::layer_bound(&s.driver, s.backing.as_deref(), mount_options(&s.root_dir).as_deref()).is_ok();
        self.layer_ok.store(ok, Ordering::Relaxed);
        *self.storage.write().unwrap() = Some(s.clone());
        Some(s)
    }

    /// Every `DISK_EVERY_MS`: the free space of Docker's root dir against `[disk] min_free` (below
    /// it: why no job starts, naming the top writers) and whether layers are bounded, both in
    /// `Health` (`gantry status`, the app's banner). Returns the problem.
    async fn watch_disk(&self, e: &Arc<Engine>) -> Option<String> {
        let now = e.now();
        if now - self.disk_at.load(Ordering::Relaxed) < crate::defaults::DISK_EVERY_MS {
            return e.health.read().unwrap().disk_problem.clone();
        }
        self.disk_at.store(now, Ordering::Relaxed);
        let st = self.storage().await?;
        let policy = e.policy();
        let driver = format!(
            "{}{}",
            st.driver,
            st.backing.as_deref().map(|b| format!(" on {b}")).unwrap_or_default()
        );
        let note = match (policy.disk.layer_size, crate::policy::layer_bound(&st.driver, st.backing.as_deref(), mount_options(&st.root_dir).as_deref())) {
            (Some(b), Ok(())) => format!("each job's writable layer is bounded to {} (disk.layer_size; {driver})", crate::units::format_bytes(b)),
            (None, _) => "jobs' writable layers are not bounded (disk.layer_size = \"none\")".to_string(),
            (Some(_), Err(why)) => format!("jobs' writable layers are NOT bounded: {why}; the free-space watch (disk.min_free = {}) guards Docker's disk instead", policy.disk.min_free.show()),
        };
        let problem = match free_space(&st.root_dir) {
            Some((free, total)) if free < policy.disk.min_free.bytes(total) => {
                let writers = self.exec.writers().await.unwrap_or_else(|err| {
                    warn!("cannot measure containers' writable layers: {err}");
                    vec![]
                });
                crate::policy::low_disk(
                    &st.root_dir,
                    free,
                    total,
                    policy.disk.min_free,
                    &e.set_in("disk.min_free"),
                    &writers,
                )
            }
            _ => None,
        };
        let mut h = e.health.write().unwrap();
        match (&problem, &h.disk_problem) {
            (Some(p), old) if old.as_deref() != Some(p.as_str()) => warn!("{p}"),
            (None, Some(_)) => info!("Docker's disk ({}) has room again: jobs start", st.root_dir),
            _ => {}
        }
        h.disk_problem = problem.clone();
        h.disk_note = Some(note);
        problem
    }
}

/// Where the owner's entries go in a container, and the image's file they are added to.
const IDENTITY_FILES: [(&str, &str); 2] = [("passwd", "/etc/passwd"), ("group", "/etc/group")];

impl DockerBackend {
    /// The container's `/etc/passwd` and `/etc/group`: the image's own plus the owner's entries
    /// ([`crate::passwd`]), written by the engine into its state dir (`staging`) and mounted read-only;
    /// and the owner's name. `None` when the owner has no usable name here. A spec mount at `/etc` or
    /// at one of the files keeps its place.
    async fn identity(
        &self,
        e: &Engine,
        job: &Job,
        name: &str,
        home: &str,
        groups: &[u32],
    ) -> Result<Option<(Vec<access::ResolvedMount>, String)>, EngineError> {
        use crate::passwd::{is_safe_field, Account};
        let Some(user) = nix::unistd::User::from_uid(job.owner_uid.into())
            .ok()
            .flatten()
            .filter(|u| is_safe_field(&u.name))
        else {
            return Ok(None);
        };
        let group_name = |gid: u32| {
            nix::unistd::Group::from_gid(gid.into())
                .ok()
                .flatten()
                .map(|g| g.name)
                .filter(|n| is_safe_field(n))
        };
        let mut named = vec![];
        for gid in std::iter::once(job.owner_gid).chain(groups.iter().copied().filter(|g| *g != job.owner_gid)) {
            if let Some(n) = group_name(gid) {
                named.push((n, gid));
            }
        }
        let account = Account {
            name: user.name.clone(),
            uid: job.owner_uid,
            gid: job.owner_gid,
            home: if is_safe_field(home) {
                home.to_string()
            } else {
                FALLBACK_HOME.to_string()
            },
            groups: named,
        };
        let taken = |target: &str| {
            job.job.mounts.iter().any(|m| {
                matches!(m.container.trim_end_matches('/'), "/etc" | "") || m.container.trim_end_matches('/') == target
            })
        };
        let wanted: Vec<(&str, &str)> = IDENTITY_FILES
            .into_iter()
            .filter(|(_, target)| !taken(target))
            .collect();
        if wanted.is_empty() {
            return Ok(None);
        }
        let paths: Vec<&str> = wanted.iter().map(|w| w.1).collect();
        let image = match self
            .exec
            .image_files(&job.image, &paths, crate::passwd::IMAGE_FILE_MAX)
            .await
        {
            Ok(f) => f,
            Err(err) => {
                warn!(
                    job = job.id,
                    "cannot read /etc/passwd and /etc/group of {}: {err}; the job gets the owner's entries only",
                    job.image
                );
                vec![None; paths.len()]
            }
        };
        let mut mounts = vec![];
        for ((file, target), from_image) in wanted.into_iter().zip(image) {
            let text = if file == "passwd" {
                crate::passwd::passwd(from_image.as_deref(), &account)
            } else {
                crate::passwd::group(from_image.as_deref(), &account)
            };
            let host = e.staging().write_generated(name, file, text.as_bytes())?;
            mounts.push(access::ResolvedMount {
                host,
                container: target.to_string(),
                read_only: true,
            });
        }
        Ok(Some((mounts, user.name)))
    }
}

/// A session without a command runs its owner's login shell (from this machine's passwd).
fn session_command(job: &Job) -> Option<Vec<String>> {
    if !job.job.spec.interactive || job.job.spec.command.is_some() {
        return None;
    }
    let shell = nix::unistd::User::from_uid(job.owner_uid.into())
        .ok()
        .flatten()
        .map(|u| u.shell.to_string_lossy().into_owned());
    // A session that carries its owner's env (`gantry shell` without an image) keeps it.
    let spec = &job.job.spec;
    let carried = spec.is_host_image()
        && ["PATH", "VIRTUAL_ENV", "CONDA_PREFIX"]
            .iter()
            .any(|k| spec.env.contains_key(*k));
    Some(crate::executor::session_argv(shell.as_deref(), !carried))
}

#[async_trait::async_trait]
impl Backend for DockerBackend {
    fn name(&self) -> &'static str {
        "Docker"
    }

    async fn start(&self, e: &Arc<Engine>) -> Vec<JoinHandle<()>> {
        // Before anything launches: pinned mounts whose container no longer exists are released.
        match self.exec.list_ours(&e.engine_id).await {
            Ok(found) => e.staging().sweep(&found.into_iter().map(|f| f.name).collect()),
            Err(err) => warn!("cannot look for stale pinned mounts yet: {err}"),
        }
        vec![]
    }

    async fn reconcile(&self, e: &Arc<Engine>, open: &[Open<'_>]) -> Result<Vec<(i64, Resumed)>, EngineError> {
        reconcile::reconcile_containers(self, e, open).await
    }

    async fn find(&self, _e: &Arc<Engine>, _job: &Job, _attempt: &Attempt) -> Option<Resumed> {
        // The table decides every Docker attempt from the containers found (by name when no id is
        // recorded): one it did not find never started.
        Some(Resumed::End {
            how: How::NeverStarted,
            run: None,
        })
    }

    async fn place(&self, e: &Arc<Engine>) -> Vec<Dispatch> {
        if e.queue.lock().unwrap().is_empty() {
            self.pulls.stop_all();
            e.waiting.write().unwrap().clear();
            *e.last_pass.lock().unwrap() = None;
            // Nothing to place, but `gantry gpus` still names other containers on the GPUs: every
            // FOREIGN_IDLE_EVERY_MS is enough for that (an idle engine then asks Docker 5x less). Docker
            // trouble is reported by passes that have work; here a failed list keeps the last one.
            if e.now() - self.foreign_at.load(Ordering::Relaxed) >= FOREIGN_IDLE_EVERY_MS {
                self.foreign_at.store(e.now(), Ordering::Relaxed);
                self.list_foreign(e, true).await;
            }
            self.watch_disk(e).await;
            // No plan, but active bookings are still watched (a no-show is released), and a dry
            // run plans on these GPUs.
            let views = self.gpu_views(e);
            *e.last_gpus.write().unwrap() = Some(views.clone());
            e.bookings_without_a_pass(views);
            return vec![];
        }
        e.refresh_stats();
        let mut down = self.ping(e).await;
        if down.is_none() {
            self.list_foreign(e, false).await;
            // Docker's disk below the lab's minimum: nothing starts, nothing is pulled.
            down = self.watch_disk(e).await;
        }
        // Missing images are pulled first: their jobs wait out of the plan, holding nothing.
        let pulling = if down.is_none() {
            self.pulls.before_pass(e, &self.exec).await
        } else {
            vec![]
        };
        let gpus = self.gpu_views(e);
        e.plan_local(gpus, down, pulling).await
    }

    async fn launch(
        &self,
        e: &Arc<Engine>,
        job: &Job,
        attempt: &Attempt,
        placed: &Placed,
        cancel: &CancellationToken,
    ) -> Launched {
        let log = e.log_of(job.id);
        append_log(
            &log,
            &format!("attempt {} of job {} on {}", attempt.n, job.id, gpu_list(&attempt.gpus)),
        );
        let binding = if e.backend_kind == BackendKind::Nvml {
            GpuBinding::Nvidia
        } else {
            GpuBinding::EnvOnly
        };
        let mut created: Option<String> = None;
        let started = async {
            // The lab may have changed since the submit: `ipc: host`, `home: mount` and `image: host` are checked again.
            let policy = e.policy();
            policy.containers.check(&job.job, &|k| e.set_in(k))?;
            // `image: host`: an empty root with this machine's system folders mounted read-only on it.
            let host_root = job
                .job
                .spec
                .is_host_image()
                .then(crate::executor::HostRoot::of_this_machine);
            let image = match &host_root {
                Some(root) => Some(self.exec.ensure_host_root(root).await?),
                None => {
                    // Pulled before it was placed (`pulls`): one removed since is pulled again, GPUs released.
                    if !self.exec.has_image(&job.image).await? {
                        return Err(EngineError::Exec(ExecError::ImageGone(job.image.clone())));
                    }
                    None
                }
            };
            let home = Engine::home_of(job.owner_uid);
            // The owner's home as HOME is a mount like any other: checked as them, pinned below.
            let mut mounts = job.job.mounts.clone();
            mounts.extend(policy.containers.home_mount(&job.job, home.as_deref()));
            // Paths change while a job waits: check the mounts as the owner again, right before create.
            let cred = Cred::of_user(job.owner_uid, job.owner_gid);
            let checked =
                access::check_mounts_async(cred.clone(), mounts, job.job.spec.workdir.clone(), e.forbidden()).await?;
            // Docker gets paths the owner cannot swap: the checked files, pinned (released in `release`).
            let name = e.container_name(job.id, attempt.n);
            let mut mounts = e.staging().stage(&name, checked)?;
            let mut container = ContainerSettings {
                // Docker's own copy of the output is bounded like Gantry's (see DOCKER_LOG_FILES).
                log_file_size: Some(policy.log_cap / 2),
                // Its writable layer, where the storage driver can bound it (`gantry status` says).
                layer_size: policy.disk.layer_size.filter(|_| self.layer_ok.load(Ordering::Relaxed)),
                ..policy
                    .containers
                    .settings(&job.job, placed.needs, &e.machine, home.as_deref())
            };
            // A whole-CPU share: pinned CPUs (near its GPUs), so the job sees as many as it may use.
            if container.nano_cpus.is_some() {
                let elsewhere = self.exec.pinned_cpus().await?;
                match e.pin_cpus(job.id, placed.needs.cpus_milli, &attempt.gpus, &elsewhere) {
                    Ok(Some(cpus)) => container.cpuset = Some(crate::resources::cpu_list(&cpus)),
                    Ok(None) => {}
                    Err(why) => {
                        append_log(&log, &why);
                        info!(job = job.id, "{why}");
                    }
                }
            }
            // The owner by name inside the container (whoami, getpass.getuser()); the machine's own
            // /etc has them already.
            if let Some(root) = &host_root {
                // System folders only root can change: nothing for the owner to swap, nothing to pin.
                mounts.extend(root.binds.iter().map(|b| access::ResolvedMount {
                    host: b.into(),
                    container: b.clone(),
                    read_only: true,
                }));
                container.user = nix::unistd::User::from_uid(job.owner_uid.into())
                    .ok()
                    .flatten()
                    .map(|u| u.name);
            } else if let Some((files, user)) = self
                .identity(
                    e,
                    job,
                    &name,
                    container.home.as_deref().unwrap_or(FALLBACK_HOME),
                    &cred.groups,
                )
                .await?
            {
                mounts.extend(files);
                container.user = Some(user);
            }
            let preemptible = policy.preemption.enabled && policy.preemption.preemptible(&job.job.spec);
            let restart_count = e.reader().preemptions(job.id, 0).map(|p| p.0).unwrap_or(0);
            // Its results folder (GANTRY_METRICS): the owner's, in a folder only the engine changes.
            let mut results_env = vec![];
            let mut start_gate = None;
            match e.make_results_dir(job) {
                Ok(Some(dir)) => {
                    mounts.push(access::ResolvedMount {
                        host: dir,
                        container: crate::engine::results::RESULTS_MOUNT.into(),
                        read_only: false,
                    });
                    results_env.push(("GANTRY_METRICS".into(), crate::engine::results::metrics_env(attempt.n)));
                }
                Ok(None) => {}
                Err(err) => append_log(&log, &format!("no GANTRY_METRICS file for this attempt: {err}")),
            }
            // Its MLflow endpoint, bound in its network namespace once it runs: only a root engine may
            // enter it (a user's own engine gives none rather than a URI nothing answers).
            if let Some(env) = crate::engine::results::mlflow::endpoint_env(&job.job.spec.env)
                .filter(|_| nix::unistd::geteuid().is_root())
            {
                results_env.extend(env);
                // A string command waits (briefly) for it, where the results folder is mounted.
                if results_env.iter().any(|(k, _)| k == "GANTRY_METRICS") {
                    start_gate = Some(crate::engine::results::mlflow::gate_in_container(attempt.n));
                }
            }
            let l = Launch {
                results_env,
                start_gate,
                preemptible,
                restart_count,
                engine_id: &e.engine_id,
                db_uid: &e.db_uid,
                name,
                job_id: job.id,
                attempt_id: attempt.id,
                attempt_n: attempt.n,
                job: &job.job,
                uid: job.owner_uid,
                gid: job.owner_gid,
                groups: cred.groups,
                mounts,
                gpus: attempt.gpus.clone(),
                gpu_uuids: attempt.gpu_uuids.clone(),
                gpu_total_memory: placed.gpu_total,
                binding,
                container,
                command: session_command(job),
                image,
            };
            let cid = self.exec.create(&l).await?;
            created = Some(cid.clone());
            let run = RunRef::Container(cid.clone());
            // If this write fails the container is still found by its name at recovery.
            let recorded = e.store().set_run(attempt.id, &run);
            if let Err(err) = recorded {
                e.store_failed(&format!("recording the container of job {}", job.id), &err);
            }
            if let Some(h) = e.running.lock().unwrap().get_mut(&job.id) {
                h.run = Some(run);
            }
            // Simulated GPUs are known by their UUIDs alone (indexes are the real machine's).
            let simulated = e.backend_kind() == crate::protocol::BackendKind::Simulated;
            let claim: Vec<(Option<u32>, String)> = attempt
                .gpus
                .iter()
                .map(|i| (!simulated).then_some(*i))
                .zip(attempt.gpu_uuids.iter().cloned())
                .collect();
            if let Some(other) = self.exec.gpu_taken(&cid, &e.engine_id, &claim).await? {
                return Err(EngineError::Exec(ExecError::GpuTaken(format!(
                    "{} was taken at the same moment by container {other}, outside this engine; trying again shortly",
                    gpu_list(&attempt.gpus)
                ))));
            }
            let cancel_requested = e.store().job(job.id).ok().flatten().is_some_and(|j| j.cancel_requested);
            if cancel.is_cancelled() || cancel_requested {
                return Ok((cid, false));
            }
            // Attached before it starts: what the job writes at once (a progress bar it then leaves
            // standing) is seen, however late the log copy begins under load.
            let attached = self.exec.attach(&cid).await;
            self.attached.lock().unwrap().insert(cid.clone(), attached);
            self.exec.start(&cid).await?;
            // Started: the container's own mount namespace holds each bind now, and Gantry never starts it
            // again, so the pins go at once (nothing under the state dir leads into a user's files).
            e.unpin_staging(&e.container_name(job.id, attempt.n));
            Ok::<_, EngineError>((cid, true))
        }
        .await;
        match started {
            Ok((cid, true)) => {
                let marked = e.store().set_running(job.id);
                match marked {
                    Ok(_) => e.store_ok(),
                    Err(err) => e.store_failed(&format!("marking job {} running", job.id), &err),
                }
                e.notify_job(job.id, JobState::Running);
                info!(job = job.id, container = %&cid[..12.min(cid.len())], "job running");
                Launched::Started {
                    run: RunRef::Container(cid),
                    at: e.now(),
                }
            }
            Ok((cid, false)) => Launched::Ended {
                how: How::CancelledBeforeStart,
                run: Some(RunRef::Container(cid)),
            },
            Err(err) => {
                if let Some(cid) = &created {
                    self.attached.lock().unwrap().remove(cid);
                }
                append_log(&log, &format!("could not start: {err}"));
                warn!(job = job.id, "could not start: {err}");
                let how = match &err {
                    EngineError::Spec(s) => How::Refused(s.to_string()),
                    EngineError::Exec(x) => How::StartFailed {
                        message: err.to_string(),
                        transient: x.is_transient(),
                    },
                    _ => How::StartFailed {
                        message: err.to_string(),
                        transient: false,
                    },
                };
                Launched::Ended {
                    how,
                    run: created.map(RunRef::Container),
                }
            }
        }
    }

    fn metrics_file(&self, e: &Engine, job: &Job, attempt: &Attempt, _run: &RunRef) -> Option<std::path::PathBuf> {
        Some(
            e.results_dir(job.id)
                .join(crate::engine::results::metrics_file_name(attempt.n)),
        )
    }

    fn watch(&self, e: &Arc<Engine>, job: &Job, attempt: &Attempt, run: &RunRef, since: Since) -> Box<dyn Watch> {
        let attached = run.container().and_then(|c| self.attached.lock().unwrap().remove(c));
        Box::new(logs::DockerWatch::new(
            self.exec.clone(),
            e.clone(),
            job,
            attempt,
            run.container().unwrap_or_default(),
            since,
            attached,
        ))
    }

    async fn abort(&self, e: &Engine, job: &Job, run: &RunRef) {
        let Some(cid) = run.container() else { return };
        if let Err(err) = self.exec.stop(cid, e.policy().stop_grace).await {
            warn!(
                job = job.id,
                "could not stop the container of a crashed supervisor: {err}"
            );
        }
    }

    async fn release(&self, e: &Engine, job_id: i64, attempt: &Attempt, run: Option<&RunRef>) {
        if let Some(cid) = run.and_then(RunRef::container) {
            // If this fails, recovery removes it later.
            if let Err(err) = self.exec.remove(cid).await {
                warn!(job = job_id, "could not remove container {cid}: {err}");
            }
        }
        // The attempt never starts again: its pinned mounts can go (a running container keeps its own copy).
        e.release_staging(&e.container_name(job_id, attempt.n));
    }

    fn sample(&self, e: &Engine) -> Result<Vec<GpuSample>, GpuError> {
        let load = e.sim_load();
        let mut b = e.gpu.lock().unwrap_or_else(|p| p.into_inner());
        b.set_load(&load);
        b.sample()
    }

    fn gpu_status(&self, e: &Engine) -> GpuStatus {
        self.status(e)
    }

    fn check_fits(&self, e: &Engine, job: &ValidJob) -> Result<(), SpecError> {
        gpus::check_fits(e, job)
    }

    fn left_running(&self) -> &'static str {
        "running containers keep running and are reattached on next start"
    }

    async fn terminal(&self, run: &RunRef) -> Result<crate::executor::Terminal, EngineError> {
        let cid = run
            .container()
            .ok_or_else(|| EngineError::Refused("this session has no container".into()))?;
        Ok(self.exec.terminal(cid).await?)
    }

    async fn connect_port(&self, run: &RunRef, port: u16) -> Result<tokio::net::TcpStream, EngineError> {
        let cid = run
            .container()
            .ok_or_else(|| EngineError::Refused("this job has no container".into()))?;
        Ok(self.exec.connect_port(cid, port).await?)
    }

    async fn mlflow_listener(
        &self,
        job: &Job,
        run: &RunRef,
    ) -> Result<Option<(std::net::TcpListener, String)>, EngineError> {
        use crate::engine::results::mlflow;
        let Some(cid) = run.container() else { return Ok(None) };
        if job.job.spec.env.contains_key(mlflow::URI_VAR) {
            return Ok(None);
        }
        // What it was given at create (the same after an engine restart).
        let Some((port, token)) = mlflow::endpoint_of(&self.exec.env_of(cid).await?) else {
            return Ok(None);
        };
        Ok(Some((self.exec.listen_in(cid, port).await?, token)))
    }

    async fn resize_terminal(&self, run: &RunRef, cols: u16, rows: u16) -> Result<(), EngineError> {
        let Some(cid) = run.container() else { return Ok(()) };
        Ok(self.exec.resize(cid, cols, rows).await?)
    }
}
