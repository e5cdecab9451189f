//! The pass (phase 2 of the loop): the backend says what starts now ([`Backend::place`]); each
//! start is claimed with a compare-and-set in SQLite (queued -> starting) and handed to its
//! supervisor. The Docker backend places with [`Engine::plan_local`]: `scheduler::plan` on this
//! machine's GPUs.
//!
//! [`Backend::place`]: super::backend::Backend::place

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::error;

use super::backend::{Dispatch, Placed, Start};
use super::{append_log, Engine, RunHandle, Stats};
use crate::config::{ETA_EVERY_MS, ETA_MAX_QUEUE, FULL_PASS_EVERY_MS, STATS_EVERY_MS};
use crate::scheduler::{self, QueuedJob, RunningJob, Waiting};
use crate::store::{Attempt, JobState, QueuedRow};

/// What one plan decided: placements (with their CPU/RAM and reservation end), the GPU views it
/// planned on, and the preemptions.
type PlannedPass = (
    Vec<(scheduler::Placement, crate::scheduler::CpuRam, Option<i64>)>,
    Vec<scheduler::GpuView>,
    Vec<scheduler::Preempt>,
);

impl Engine {
    /// One pass, whatever the backend: the queue is current, a failed database is probed, the
    /// backend places, and what it places starts.
    pub async fn pass(self: Arc<Self>) {
        if self.queue.lock().unwrap().is_stale() {
            if let Err(e) = self.store().track_queue() {
                error!("cannot read the queue: {e}");
                return;
            }
        }
        // A failed write stops all starts; only a write that succeeds clears it. When the failing write was
        // a start (so nothing else writes), probe with a tiny write each pass.
        if self.health.read().unwrap().store_problem.is_some() {
            let probe = self.store().set_meta("write_probe", &self.now().to_string());
            match probe {
                Ok(()) => self.store_ok(),
                Err(e) => self.store_failed("probing the database", &e),
            }
        }
        let placed = self.backend.place(&self).await;
        self.dispatch(placed);
    }

    /// Claim each start and hand it to a supervisor. A database that fails stops the pass.
    fn dispatch(self: &Arc<Self>, placed: Vec<Dispatch>) {
        for d in placed {
            match d {
                Dispatch::One(s) => {
                    let Some(claimed) = self.claim(&s) else { return };
                    let Some((attempt, cancel)) = claimed else { continue }; // cancelled or taken meanwhile
                    self.supervise(s.job.id, self.clone().run_attempt(s.job, attempt, s.placed, cancel));
                }
                Dispatch::Together(starts) => {
                    let Some(placed) = starts.first().map(|s| s.placed.clone()) else {
                        continue;
                    };
                    let mut parts = vec![];
                    for s in starts {
                        let Some(claimed) = self.claim(&s) else { return };
                        if let Some((attempt, cancel)) = claimed {
                            parts.push((s.job, attempt, cancel));
                        }
                    }
                    if parts.len() == 1 {
                        let (job, attempt, cancel) = parts.pop().unwrap();
                        self.supervise(job.id, self.clone().run_attempt(job, attempt, placed, cancel));
                    } else if let Some(first) = parts.first().map(|p| p.0.id) {
                        self.supervise(first, self.clone().run_together(parts, placed));
                    }
                }
            }
        }
    }

    /// queued -> starting with a new attempt, and its handle in `running`. `None`: the database
    /// failed (stop the pass); `Some(None)`: the job is no longer queued.
    fn claim(&self, s: &Start) -> Option<Option<(Attempt, CancellationToken)>> {
        let job = &s.job;
        let begun = self
            .store()
            .begin_attempt_noted(job.id, &s.gpus, &s.gpu_uuids, s.note.as_deref());
        match begun {
            Ok(Some(a)) => {
                let cancel = CancellationToken::new();
                let now = self.now();
                let victim = self.victim_of(job, now);
                self.claims.lock().unwrap().remove(&job.id);
                self.preempted_at.lock().unwrap().remove(&job.id);
                self.running.lock().unwrap().insert(
                    job.id,
                    RunHandle {
                        over_memory: None,
                        key: job.key(),
                        owner: job.owner.clone(),
                        gpus: s.gpus.clone(),
                        gpu_memory: self.gpu_memory_of(&job.key(), job.gpu_memory),
                        run: None,
                        cancel: cancel.clone(),
                        monitored: true,
                        expected_end: job.job.expected_runtime.and(s.runtime).map(|r| now + r),
                        // Undeclared, or a declaration not trusted with no history to replace it.
                        learn: (job.job.expected_runtime.is_none() || s.runtime.is_none()).then(|| (job.key(), now)),
                        declared: job.job.expected_runtime.map(|r| scheduler::Declared {
                            started_ms: now,
                            runtime_ms: r.as_millis() as i64,
                        }),
                        needs: s.placed.needs,
                        cpuset: vec![],
                        victim,
                        preempt: CancellationToken::new(),
                    },
                );
                self.notify_job(job.id, JobState::Starting);
                Some(Some((a, cancel)))
            }
            Ok(None) => Some(None),
            Err(e) => {
                self.store_failed(&format!("starting job {}", job.id), &e);
                None
            }
        }
    }

    /// What the scheduler needs to preempt `job`'s attempt that starts (or was found) at `started`;
    /// `None` when it is not preemptible (its spec, else the lab's `default_preemptible`) or
    /// preemption is off. The counts come from its attempts (a failed read: not preemptible now).
    pub(super) fn victim_of(&self, job: &crate::store::Job, started: i64) -> Option<scheduler::Victim> {
        let policy = self.policy();
        if !policy.preemption.enabled || !policy.preemption.preemptible(&job.job.spec) {
            return None;
        }
        let st = self.reader();
        let (_, today, _) = st.preemptions(job.id, started - 24 * 3_600_000).ok()?;
        Some(scheduler::Victim {
            priority: job.priority,
            started_ms: started,
            submitted_ms: job.submitted_at,
            preempted_today: today,
            preempted_for: st.preempted_for(job.id).ok()?,
            took_from: st.took_from(job.id).ok()?,
            checkpoint_ms: None,
            // The job's own word: its latest `checkpoint` metrics point in this attempt (issue 32).
            last_checkpoint_ms: st.last_checkpoint(job.id, started).ok().flatten(),
            stopping_for: None,
        })
    }

    /// Carry out the plan's preemptions: record each one on its attempt (so an engine killed now
    /// finishes it on restart), then tell its supervisor. A failed write preempts nothing.
    pub(super) fn preempt(&self, decisions: Vec<scheduler::Preempt>) {
        for d in decisions {
            let (token, gpus) = {
                let r = self.running.lock().unwrap();
                let Some(h) = r.get(&d.job) else { continue };
                if h.victim.as_ref().is_none_or(|v| v.stopping_for.is_some()) {
                    continue;
                }
                (h.preempt.clone(), h.gpus.clone())
            };
            let attempt = self.reader().open_attempt(d.job);
            let Ok(Some(attempt)) = attempt else { continue };
            // A booking's preemption is for no job (`for_job` 0): it says whose booking.
            let booking = matches!(d.why, scheduler::PreemptWhy::Booking { .. });
            let why = if booking {
                d.why.to_string()
            } else {
                format!("job {} ({})", d.for_job, d.why)
            };
            let marked = self.store().mark_preempting(attempt.id, d.for_job, &why);
            match marked {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    self.store_failed(&format!("recording the preemption of job {}", d.job), &e);
                    return;
                }
            }
            if let Some(v) = self
                .running
                .lock()
                .unwrap()
                .get_mut(&d.job)
                .and_then(|h| h.victim.as_mut())
            {
                v.stopping_for = Some(d.for_job);
            }
            tracing::info!(job = d.job, for_job = d.for_job, "preempting job {} for {why}", d.job);
            append_log(
                &self.log_of(d.job),
                &format!("preempted by {why}: checkpoint signal, then stop; queued again at its place"),
            );
            if booking {
                token.cancel();
                continue;
            }
            // Every GPU it will start on, not only the victim's (see `Preempt::gpus`).
            let mut claim = self.claims.lock().unwrap();
            let c = claim.entry(d.for_job).or_default();
            c.extend(gpus.into_iter().chain(d.gpus.iter().copied()));
            c.sort();
            c.dedup();
            drop(claim);
            token.cancel();
        }
    }

    /// Place on this machine's GPUs (`gpus`, as the backend sees them) with `scheduler::plan`. Cheap
    /// when nothing it reads has changed (it then places nothing); otherwise the planning runs on a
    /// blocking thread, so a deep queue never holds up the API. `down`: why the backend cannot start
    /// anything now (then nothing starts and that is every job's reason). `held_back`: jobs that stay
    /// out of the plan, with their reason (their image is being pulled).
    pub(super) async fn plan_local(
        self: &Arc<Self>,
        gpus: Vec<scheduler::GpuView>,
        down: Option<String>,
        held_back: Vec<(i64, String)>,
    ) -> Vec<Dispatch> {
        let version = self.queue.lock().unwrap().version();
        let store_problem = self.health.read().unwrap().store_problem.clone();
        let now = self.now();
        let running = self.running_jobs(now);
        // Everything a plan depends on, other than the clock. The same inputs plan the same thing, so
        // the pass stops here, unless the clock may have changed the answer: a retry's backoff ended,
        // or FULL_PASS_EVERY passed (reservations and backfill windows move with time, in minutes).
        let inputs = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            version.hash(&mut h);
            // Running jobs by what they hold; their expected ends move with the clock (learned ones
            // each pass), which FULL_PASS_EVERY covers.
            let held: Vec<(i64, &Vec<u32>, Option<u64>)> =
                running.iter().map(|r| (r.job_id, &r.gpus, r.gpu_memory)).collect();
            serde_json::to_vec(&(&gpus, &held)).unwrap_or_default().hash(&mut h);
            (&store_problem, &down, self.stats.lock().unwrap().at, &held_back).hash(&mut h);
            // Bookings: made, cancelled or released (the cache is emptied), started or ended.
            self.booking_holds(now).len().hash(&mut h);
            self.bookings_phase(now).hash(&mut h);
            h.finish()
        };
        if let Some((last, at)) = *self.last_pass.lock().unwrap() {
            let clock = now - at >= FULL_PASS_EVERY_MS || self.queue.lock().unwrap().retry_due(at, now);
            if last == inputs && !clock {
                return vec![];
            }
        }
        *self.last_pass.lock().unwrap() = Some((inputs, now));
        let queued: Vec<Arc<QueuedRow>> = self.queue.lock().unwrap().rows();
        let me = self.clone();
        let planned = tokio::task::spawn_blocking(move || {
            me.plan_pass(queued, running, gpus, now, store_problem.or(down), held_back)
        })
        .await;
        let (placements, gpus, preempt) = match planned {
            Ok(p) => p,
            Err(e) => {
                error!("the scheduling pass failed: {e}");
                *self.last_pass.lock().unwrap() = None;
                return vec![];
            }
        };
        self.preempt(preempt);
        let uuids: Vec<(u32, String, u64)> = self
            .latest
            .read()
            .unwrap()
            .iter()
            .map(|g| (g.index, g.uuid.clone(), g.memory_total))
            .collect();
        let mut starts = vec![];
        for (p, needs, runtime) in placements {
            let job = match self.store().job(p.job_id) {
                Ok(Some(j)) => j,
                Ok(None) => continue,
                Err(e) => {
                    error!("cannot read job {}: {e}", p.job_id);
                    break;
                }
            };
            let gpu_uuids: Vec<String> = p
                .gpus
                .iter()
                .filter_map(|i| uuids.iter().find(|u| u.0 == *i).map(|u| u.1.clone()))
                .collect();
            let gpu_total = p
                .gpus
                .first()
                .and_then(|i| uuids.iter().find(|u| u.0 == *i).map(|u| u.2));
            let note = scheduler::topology_note(&gpus, &p.gpus);
            starts.push(Dispatch::One(Start {
                job,
                gpus: p.gpus,
                gpu_uuids,
                note,
                runtime,
                placed: Placed {
                    gpu_total,
                    needs,
                    after: vec![],
                },
            }));
        }
        starts
    }

    /// The CPU-heavy part of a pass (blocking; it reads the store only for dependencies and learned
    /// runtimes): the plan, "why waiting" for every queued job, start estimates. Returns what to start
    /// (with its CPU/RAM) and the GPU views it planned on. With `no_starts` (Docker away, or a state
    /// write failed) nothing starts and that is every job's reason.
    fn plan_pass(
        &self,
        mut queued: Vec<Arc<QueuedRow>>,
        running: Vec<RunningJob>,
        gpus: Vec<scheduler::GpuView>,
        now: i64,
        no_starts: Option<String>,
        held_back: Vec<(i64, String)>,
    ) -> PlannedPass {
        let mut blocked = self.check_dependencies(&mut queued);
        let out: std::collections::HashSet<i64> = held_back.iter().map(|h| h.0).collect();
        queued.retain(|j| !out.contains(&j.id));
        blocked.extend(held_back);
        // Held jobs stay out of the plan but keep a reason, so `gantry ls` says why they wait.
        queued.retain(|j| {
            if j.held {
                blocked.push((j.id, format!("held by its owner (`gantry release {}`)", j.id)));
            }
            !j.held
        });
        let policy = self.policy();
        // Once per pass, not per queued job.
        let host = self.host_capacity(&policy);
        let gpu_count = self.latest.read().unwrap().iter().filter(|g| self.usable(g)).count();
        // A GPU-sharing job's part of a GPU (see `Engine::sharing_part`), the GPUs read once.
        let largest = self.sharing_part(Some(0)).map(|p| p.1);
        let (usage, typical_wait, shapes, history, overruns) = {
            let s = self.stats.lock().unwrap();
            (
                s.usage.clone(),
                s.typical_wait,
                s.shapes.clone(),
                s.history.clone(),
                s.overruns.clone(),
            )
        };
        let preempted_at = self.preempted_at.lock().unwrap().clone();
        let claims: Vec<(i64, Vec<u32>)> = {
            let mut c = self.claims.lock().unwrap();
            c.retain(|j, _| queued.iter().any(|q| q.id == *j));
            c.iter().map(|(j, g)| (*j, g.clone())).collect()
        };
        let holds = self.booking_holds(now);
        let booked_ahead = holds.iter().any(|b| b.start_ms > now);
        // Which queued jobs would be preemptible: GPU jobs may go on a booking's GPUs before its start,
        // CPU-only ones may take free GPUs' CPU/RAM shares (`scheduler::cpu_only`).
        let ids: Vec<i64> = queued
            .iter()
            .filter(|j| !j.interactive && (j.gpus == 0 || booked_ahead))
            .map(|j| j.id)
            .collect();
        let preemptible = if ids.is_empty() {
            vec![]
        } else {
            self.queued_preemptible(&ids)
        };
        // A job preempted `max_per_day` times in the last day is past the guard rails: a booking's
        // start could not preempt it, so it is not "preemptible" for a booked GPU.
        let max_per_day = policy.preemption.rules.max_per_day;
        let preemptible: Vec<i64> = preemptible
            .into_iter()
            .filter(|id| {
                !preempted_at.contains_key(id)
                    || self
                        .reader()
                        .preemptions(*id, now - 86_400_000)
                        .is_ok_and(|p| p.1 < max_per_day)
            })
            .collect();
        // Runtimes a booking may trust: learned from the owner's own runs of that name and shape
        // (p95), else none (`unproven`: other jobs' runs say nothing of this one's).
        let (mut cautious_runtimes, mut unproven_runtimes) = (vec![], vec![]);
        if holds.iter().any(|b| b.start_ms > now) {
            for j in queued.iter().filter(|j| j.expected_runtime_ms.is_none()) {
                match history.estimate(&j.key(), 0) {
                    Some(e) if e.basis == crate::estimate::Basis::SameJob => cautious_runtimes.push((j.id, e.p95_ms)),
                    _ => unproven_runtimes.push(j.id),
                }
            }
        }
        let inputs = JobInputs {
            policy: &policy,
            host,
            gpu_count,
            usage: &usage,
            history: &history,
            overruns: &overruns,
            largest_gpu: largest,
        };
        let state = scheduler::State {
            now_ms: now,
            gpus,
            running,
            queued: queued
                .iter()
                .map(|j| QueuedJob {
                    preempted_at_ms: preempted_at.get(&j.id).map(|p| p.0),
                    ..self.scheduled(j, &inputs)
                })
                .collect(),
            config: scheduler::Config {
                reserve_after_ms: policy.reserve_after.as_millis() as i64,
                overrun_margin_ms: policy.overrun_margin.as_millis() as i64,
                max_running_gpus_per_user: policy.max_running_gpus,
                gpu_share: Some(policy.containers.needs(1, None, None, host, gpu_count)),
                cpu_only_limit: Some(policy.containers.cpu_only_limit(host, gpu_count)),
                preemption: policy.preemption.rules(),
                claims,
                shapes,
                bookings: holds,
                preemptible,
                cautious_runtimes,
                unproven_runtimes,
                ..self.cfg.scheduler.clone()
            },
            typical_wait_ms: typical_wait,
            host: Some(host),
        };
        let mut plan = scheduler::plan(&state);
        let assigned = if state.config.bookings.is_empty() {
            vec![]
        } else {
            scheduler::assign(&state)
        };
        self.tend_bookings(now, assigned);
        let sessions: std::collections::HashSet<i64> = queued.iter().filter(|j| j.interactive).map(|j| j.id).collect();
        scheduler::keep_free(&mut plan, &state, &sessions, policy.sessions.keep_free);
        if state.now_ms - self.eta_at.load(Ordering::Relaxed) >= ETA_EVERY_MS {
            self.eta_at.store(state.now_ms, Ordering::Relaxed);
            *self.eta.write().unwrap() = if state.queued.len() <= ETA_MAX_QUEUE {
                scheduler::estimate_starts(&state, 3_600_000, ETA_MAX_QUEUE)
            } else {
                HashMap::new()
            };
        }
        // A preempted job says so until it runs again; a job with a `begin` says when it starts.
        let begins: HashMap<i64, i64> = queued
            .iter()
            .filter_map(|j| {
                j.begin_ms
                    .filter(|b| *b > now && j.not_before == Some(*b))
                    .map(|b| (j.id, b))
            })
            .collect();
        for w in plan.waiting.iter_mut() {
            if let Some((_, by)) = preempted_at.get(&w.job_id) {
                w.reason = format!("preempted by {by} · resumes when GPUs free");
            } else if let Some(b) = begins.get(&w.job_id) {
                w.reason = starts_at(*b, now);
            }
        }
        for (id, reason) in blocked {
            plan.waiting.push(Waiting {
                job_id: id,
                position: plan.waiting.len() + 1,
                reason,
                reserved: vec![],
            });
        }
        // Nothing starts while Docker is away or the database cannot record a start; nothing is
        // preempted either.
        if no_starts.is_some() {
            plan.preempt.clear();
        }
        if let Some(msg) = no_starts {
            for (i, p) in plan.placements.drain(..).enumerate() {
                plan.waiting.push(Waiting {
                    job_id: p.job_id,
                    position: i + 1,
                    reason: msg.clone(),
                    reserved: vec![],
                });
            }
        }
        let waiting: BTreeMap<i64, Waiting> = std::mem::take(&mut plan.waiting)
            .into_iter()
            .map(|w| (w.job_id, w))
            .collect();
        // The old map is dropped outside the lock.
        let old = std::mem::replace(&mut *self.waiting.write().unwrap(), waiting);
        drop(old);
        // Each placement with its CPU/RAM and its expected runtime (declared or learned).
        let placements = plan.placements.into_iter().map(|p| {
            let q = state.queued.iter().find(|q| q.job_id == p.job_id);
            (
                p,
                q.map(|q| q.needs).unwrap_or_default(),
                q.and_then(|q| q.expected_runtime_ms),
            )
        });
        // What a dry run plans on (`Engine::preview`).
        *self.last_gpus.write().unwrap() = Some(state.gpus.clone());
        (placements.collect(), state.gpus, std::mem::take(&mut plan.preempt))
    }

    /// The running jobs as the scheduler sees them: what they hold and when they should end.
    pub(super) fn running_jobs(&self, now: i64) -> Vec<RunningJob> {
        let history = self.stats.lock().unwrap().history.clone();
        self.running
            .lock()
            .unwrap()
            .iter()
            .map(|(id, h)| RunningJob {
                job_id: *id,
                user: h.owner.clone(),
                gpus: h.gpus.clone(),
                gpu_memory: h.gpu_memory,
                expected_end_ms: h.expected_end.or_else(|| learned_end(&history, h, now)),
                needs: h.needs,
                victim: h.victim.clone(),
                declared: h.declared,
            })
            .collect()
    }

    /// A queued job as the scheduler sees it (not yet preempted).
    pub(super) fn scheduled(&self, j: &QueuedRow, i: &JobInputs<'_>) -> QueuedJob {
        QueuedJob {
            job_id: j.id,
            user: j.owner.clone(),
            priority: scheduling_priority(j, i.policy),
            submitted_at_ms: j.submitted_at,
            gpus: j.gpus,
            gpu_memory: self.gpu_memory_of(&j.key(), j.gpu_memory),
            not_before_ms: j.not_before,
            expected_runtime_ms: expected_runtime(i.history, j, i.overruns.get(&j.owner).copied().unwrap_or(0)),
            user_usage: i.usage.get(&j.owner).copied().unwrap_or(0.0),
            filter: j.gpu_filter.clone(),
            // A job queued before the lab's share shrank is held to the ceiling, like new ones.
            needs: ceil_needs(
                i.policy.containers.needs_sharing(
                    j.gpus,
                    j.cpus_milli,
                    j.memory,
                    i.host,
                    i.gpu_count,
                    j.gpu_memory.zip(i.largest_gpu),
                ),
                i.policy.containers.ceiling(j.gpus, i.host, i.gpu_count),
            ),
            preempted_at_ms: None,
        }
    }

    /// Fair-share usage (decayed GPU-hours per owner) and the typical wait.
    pub(super) fn refresh_stats(&self) {
        let now = self.now();
        if now - self.stats.lock().unwrap().at < STATS_EVERY_MS {
            return;
        }
        let hl = self.policy().fair_share_half_life.as_millis().max(1) as i64;
        let rows = self
            .usage_worth(now - crate::config::FAIR_SHARE_REACH * hl)
            .unwrap_or_default();
        let margin = self.policy().overrun_margin.as_millis() as i64;
        let (typical, runs, shapes, overruns) = {
            let st = self.reader();
            (
                st.typical_wait(now - 24 * 3_600_000).ok().flatten(),
                st.recent_runtimes(crate::config::HISTORY_RUNS).unwrap_or_default(),
                st.recent_shapes(crate::sim::SHAPE_WINDOW).unwrap_or_default(),
                st.overruns_since(now - crate::config::OVERRUN_WINDOW_MS, margin),
            )
        };
        // A failed read keeps the last counts (a declaration is not trusted again because of it).
        let overruns = match overruns {
            Ok(o) => o,
            Err(e) => {
                error!("cannot count runtime overruns: {e}");
                self.stats.lock().unwrap().overruns.clone()
            }
        };
        let usage = crate::store::decayed_worth(&rows, now, hl);
        let history = Arc::new(crate::estimate::History::from_runs(&runs));
        let shapes = scheduler::shape_mix(shapes);
        *self.stats.lock().unwrap() = Stats {
            at: now,
            usage,
            typical_wait: typical,
            history,
            shapes,
            overruns,
        };
    }

    /// Drop jobs whose dependencies have not succeeded yet from `queued` (returned with a reason);
    /// fail jobs whose dependencies ended without success.
    fn check_dependencies(&self, queued: &mut Vec<Arc<QueuedRow>>) -> Vec<(i64, String)> {
        let mut blocked = vec![];
        let mut failed = vec![];
        queued.retain(|j| {
            for d in &j.after {
                match self.reader().state_of(*d) {
                    Ok(Some(JobState::Succeeded)) => continue,
                    Ok(Some(s)) if s.is_final() => {
                        failed.push((
                            j.id,
                            format!("dependency job {d} ended {}; this job will not run", s.as_str()),
                        ));
                        return false;
                    }
                    Ok(Some(s)) => {
                        blocked.push((j.id, format!("waiting for job {d} to succeed (it is {})", s.as_str())));
                        return false;
                    }
                    Ok(None) => {
                        failed.push((j.id, format!("dependency job {d} no longer exists")));
                        return false;
                    }
                    Err(e) => {
                        blocked.push((j.id, format!("cannot read dependency job {d}: {e}")));
                        return false;
                    }
                }
            }
            true
        });
        for (id, msg) in failed {
            match self.store().fail_queued(id, &msg) {
                Ok(true) => self.notify_job(id, JobState::Failed),
                Ok(false) => {}
                Err(e) => self.store_failed(&format!("failing job {id}"), &e),
            }
        }
        blocked
    }
}

/// What turns a queued row into the scheduler's [`QueuedJob`], read once per pass.
pub(super) struct JobInputs<'a> {
    pub policy: &'a crate::policy::Policy,
    pub host: crate::scheduler::CpuRam,
    pub gpu_count: usize,
    pub usage: &'a HashMap<String, f64>,
    pub history: &'a crate::estimate::History,
    pub overruns: &'a HashMap<String, u32>,
    /// The largest GPU's memory: a GPU-sharing job's CPU/RAM is its declared part of a GPU's share.
    pub largest_gpu: Option<u64>,
}

/// The reason a job with a `begin` still ahead waits: "starts at 22:00" (with the day when not today).
pub(crate) fn starts_at(begin_ms: i64, now: i64) -> String {
    use crate::units::{local_datetime, local_hhmm};
    let (b, n) = (local_datetime(begin_ms), local_datetime(now));
    if b[..10] == n[..10] {
        format!("starts at {} (its `begin`)", local_hhmm(begin_ms))
    } else {
        format!("starts at {b} (its `begin`)")
    }
}

fn ceil_needs(n: crate::scheduler::CpuRam, c: crate::scheduler::CpuRam) -> crate::scheduler::CpuRam {
    crate::scheduler::CpuRam {
        cpus_milli: n.cpus_milli.min(c.cpus_milli),
        memory: n.memory.min(c.memory),
    }
}

/// A queued job's declared runtime, else the median learned from similar completed runs
/// (`estimate::History`: same owner+name+image+shape, else same shape, else same GPU count, else all).
/// The priority a queued job is ordered by: its own, or, for an interactive session while the lab
/// puts sessions before batch jobs (`[sessions] before_batch`), its own plus [`SESSION_PRIORITY`]
/// (someone is waiting at a terminal).
fn scheduling_priority(j: &QueuedRow, policy: &crate::policy::Policy) -> i32 {
    if j.interactive && policy.sessions.before_batch {
        j.priority.saturating_add(SESSION_PRIORITY)
    } else {
        j.priority
    }
}

/// Above any priority a lab gives batch jobs (the admins' range is ±1,000 by default), with room
/// for sessions' own priorities to order them among themselves (the scheduler names a preemption
/// for one "an interactive session").
use crate::scheduler::SESSION_PRIORITY;

/// A queued job's runtime as the scheduler plans it: its declaration, unless its owner overran
/// declarations lately (`overruns`; then no less than the learned p80), else the learned median
/// (`estimate::trusted_runtime`).
fn expected_runtime(history: &crate::estimate::History, j: &QueuedRow, overruns: u32) -> Option<i64> {
    let strikes = crate::config::OVERRUN_STRIKES;
    match j.expected_runtime_ms {
        // Trusted: no estimate to compute (a pass over a deep queue of declared jobs stays cheap).
        Some(d) if overruns < strikes => Some(d),
        declared => {
            crate::estimate::trusted_runtime(declared, history.estimate(&j.key(), 0).as_ref(), overruns, strikes)
        }
    }
}

/// A running job without a declared runtime: now + the learned median of its remaining runtime, given
/// how long it has run (`None` while the history is too thin).
fn learned_end(history: &crate::estimate::History, h: &super::RunHandle, now: i64) -> Option<i64> {
    let (key, started) = h.learn.as_ref()?;
    history.estimate(key, (now - started).max(0)).map(|e| now + e.p50_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::{History, JobKey};

    fn handle(learn: Option<(JobKey, i64)>, declared_end: Option<i64>) -> super::super::RunHandle {
        super::super::RunHandle {
            over_memory: None,
            key: Default::default(),
            owner: "ada".into(),
            gpus: vec![0],
            gpu_memory: None,
            run: None,
            cancel: CancellationToken::new(),
            monitored: true,
            expected_end: declared_end,
            declared: None,
            learn,
            needs: Default::default(),
            cpuset: vec![],
            victim: None,
            preempt: CancellationToken::new(),
        }
    }

    /// The engine gives a running job without a declared runtime the learned median of what REMAINS,
    /// given how long it has run (as the simulator does), and nothing while the history is thin.
    #[test]
    fn running_jobs_end_at_the_learned_remaining_median() {
        let key = JobKey {
            user: "ada".into(),
            name: "train".into(),
            image: "img".into(),
            gpus: 1,
            gpu_memory: None,
            cpus_milli: 0,
            memory: 0,
        };
        let mins = |m: i64| m * 60_000;
        // Past runs of this job: 10, 20, ..., 100 minutes.
        let runs: Vec<(JobKey, i64)> = (1..=10).map(|i| (key.clone(), mins(10 * i))).collect();
        let history = History::from_runs(&runs);
        let now = 1_000_000_000;
        let fresh = learned_end(&history, &handle(Some((key.clone(), now)), None), now).unwrap();
        let aged = learned_end(&history, &handle(Some((key.clone(), now - mins(25))), None), now).unwrap();
        assert!(
            fresh - now >= mins(40) && fresh - now <= mins(60),
            "a fresh job: about the median run ({} min)",
            (fresh - now) / 60_000
        );
        // After 25 min only the 8 runs longer than that count (30..100 min): their median less 25 min.
        assert!(
            aged - now >= mins(30) && aged - now <= mins(45) && aged - now < fresh - now,
            "after 25 min: {} min left",
            (aged - now) / 60_000
        );
        assert_eq!(
            learned_end(
                &History::from_runs(&runs[..3]),
                &handle(Some((key.clone(), now)), None),
                now
            ),
            None,
            "3 runs are too few"
        );
        assert_eq!(
            learned_end(&history, &handle(None, Some(now + 5)), now),
            None,
            "a declared runtime is used as declared"
        );
    }
}
