//! Trace replay: runs a workload through the same `scheduler::plan` the engine uses, on a virtual
//! clock (no Docker, no sleeping), and reports makespan, utilization, waits and per-user shares.
//!
//! Trace formats (detected from the header):
//! - Gantry CSV: `submit_s,duration_s,gpus,gpu_memory,user,priority` (`gpu_memory` empty = whole GPUs,
//!   else a size like `8GiB`; `user` and `priority` optional).
//! - Alibaba GPU-cluster CSV (`num_gpu`, `gpu_milli`, `creation_time`, `deletion_time`): duration =
//!   deletion − creation; `gpu_milli` < 1000 on a 1-GPU task is a share of one GPU.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::estimate::{Estimate, History, JobKey};
use crate::scheduler::{self, GpuView, QueuedJob, RunningJob};

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot read the trace: {0}")]
    Io(#[from] std::io::Error),
    #[error("trace line {line}: {msg}")]
    Parse { line: usize, msg: String },
    #[error("unknown trace format: expected a header with `submit_s,duration_s,gpus,...` or Alibaba's `num_gpu,gpu_milli,creation_time,deletion_time`")]
    UnknownFormat,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceJob {
    pub submit_s: f64,
    pub duration_s: f64,
    pub gpus: u32,
    /// Share of one GPU in thousandths (1000 = whole); `None` = whole GPUs.
    pub gpu_milli: Option<u32>,
    pub user: String,
    pub priority: i32,
    /// What the engine would know as the job's name (and image): the Gantry CSV's `name` column; for
    /// Alibaba, the QoS class (pod names there are unique).
    #[serde(default)]
    pub name: String,
    /// CPUs (thousandths) and RAM (MiB) asked for: part of the request shape the estimator groups by.
    #[serde(default)]
    pub cpus_milli: u64,
    #[serde(default)]
    pub memory_mib: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    pub jobs: Vec<TraceJob>,
    /// Tasks asking for no GPU (not part of a GPU queue).
    pub dropped_cpu_only: usize,
    /// Tasks asking for more GPUs than the machine has.
    pub dropped_too_big: usize,
    pub dropped_zero_duration: usize,
}

/// Parse a trace; jobs needing more than `max_gpus` are dropped and counted.
pub fn load_trace(path: &Path, max_gpus: u32) -> Result<Trace, SimError> {
    parse_trace(&std::fs::read_to_string(path)?, max_gpus)
}

pub fn parse_trace(text: &str, max_gpus: u32) -> Result<Trace, SimError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#'));
    let (_, header) = lines.next().ok_or(SimError::UnknownFormat)?;
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let idx = |n: &str| cols.iter().position(|c| *c == n);
    let mut t = Trace::default();
    let alibaba = idx("num_gpu").is_some() && idx("creation_time").is_some();
    let gantry = idx("submit_s").is_some() && idx("duration_s").is_some() && idx("gpus").is_some();
    if !alibaba && !gantry {
        return Err(SimError::UnknownFormat);
    }
    for (i, line) in lines {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let get = |n: &str| idx(n).and_then(|k| f.get(k)).copied().unwrap_or("");
        let num = |n: &str| -> Result<f64, SimError> {
            get(n).parse::<f64>().map_err(|_| SimError::Parse {
                line: i + 1,
                msg: format!("`{n}` is not a number: {:?}", get(n)),
            })
        };
        let job = if alibaba {
            let gpus = num("num_gpu")? as u32;
            let milli = num("gpu_milli").unwrap_or(1000.0) as u32;
            TraceJob {
                submit_s: num("creation_time")?,
                duration_s: num("deletion_time")? - num("creation_time")?,
                gpus,
                gpu_milli: (gpus == 1 && milli > 0 && milli < 1000).then_some(milli),
                user: "default".into(),
                priority: 0,
                name: get("qos").to_string(),
                cpus_milli: num("cpu_milli").unwrap_or(0.0) as u64,
                memory_mib: num("memory_mib").unwrap_or(0.0) as u64,
            }
        } else {
            let mem = get("gpu_memory");
            TraceJob {
                submit_s: num("submit_s")?,
                duration_s: num("duration_s")?,
                gpus: num("gpus")? as u32,
                gpu_milli: if mem.is_empty() {
                    None
                } else if let Ok(m) = mem.parse::<u32>() {
                    Some(m.min(1000))
                } else {
                    return Err(SimError::Parse {
                        line: i + 1,
                        msg: format!("gpu_memory {mem:?}: write thousandths of a GPU (e.g. 250)"),
                    });
                },
                user: Some(get("user"))
                    .filter(|u| !u.is_empty())
                    .unwrap_or("default")
                    .to_string(),
                priority: get("priority").parse().unwrap_or(0),
                name: get("name").to_string(),
                cpus_milli: 0,
                memory_mib: 0,
            }
        };
        if job.gpus == 0 {
            t.dropped_cpu_only += 1;
        } else if job.gpus > max_gpus {
            t.dropped_too_big += 1;
        } else if job.duration_s <= 0.0 {
            t.dropped_zero_duration += 1;
        } else {
            t.jobs.push(job);
        }
    }
    t.jobs.sort_by(|a, b| a.submit_s.total_cmp(&b.submit_s));
    Ok(t)
}

/// Rescale arrivals so the offered GPU demand (GPU-seconds per second of arrivals) is `load` x the
/// machine's capacity.
pub fn rescale_load(jobs: &mut [TraceJob], gpus: u32, load: f64) {
    let first = jobs.iter().map(|j| j.submit_s).fold(f64::INFINITY, f64::min);
    let last = jobs.iter().map(|j| j.submit_s).fold(f64::NEG_INFINITY, f64::max);
    let span = last - first;
    if span <= 0.0 || load <= 0.0 {
        return;
    }
    let work: f64 = jobs.iter().map(gpu_seconds).sum();
    let new_span = work / (load * gpus as f64);
    for j in jobs.iter_mut() {
        j.submit_s = (j.submit_s - first) * new_span / span;
    }
}

fn gpu_seconds(j: &TraceJob) -> f64 {
    j.duration_s * j.gpu_milli.map(|m| m as f64 / 1000.0).unwrap_or(j.gpus as f64)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// One job at a time.
    Serial,
    /// Strict priority/submission order: the head of the queue blocks everyone behind it.
    Fifo,
    /// First fit over the whole queue, no reservations.
    Greedy,
    /// Gantry's scheduler as the engine runs it.
    Gantry,
}

impl Policy {
    pub const ALL: [Policy; 4] = [Policy::Serial, Policy::Fifo, Policy::Greedy, Policy::Gantry];
    pub fn parse(s: &str) -> Option<Policy> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }
    pub fn name(self) -> &'static str {
        match self {
            Policy::Serial => "serial",
            Policy::Fifo => "fifo",
            Policy::Greedy => "greedy",
            Policy::Gantry => "gantry",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SimConfig {
    pub gpus: u32,
    pub gpu_memory: u64,
    pub policy: Policy,
    /// Pass trace durations to the scheduler as declared `expected_runtime`.
    pub declared_runtimes: bool,
    pub scheduler: scheduler::Config,
    /// Fair share: decay users' GPU-hours with this half-life (seconds); `None` = off.
    #[serde(default)]
    pub fair_share_half_life_s: Option<f64>,
    /// Without declared runtimes, estimate them from the jobs completed so far (what the engine
    /// does from its store). Off: the scheduler knows no runtimes at all.
    #[serde(default)]
    pub learn_runtimes: bool,
    /// Preemption (Gantry's policy only): `None` = off.
    #[serde(default)]
    pub preempt: Option<SimPreempt>,
    /// With declared runtimes, some users lie about them (`gantry sim --lying-users`).
    #[serde(default)]
    pub lying: Option<SimLying>,
}

/// `gantry sim --runtimes --lying-users S`: a share `S` of the users (rounded, at least one; picked by a
/// fixed hash of the name, so every policy and seed agrees) declare
/// `expected_runtime: 1s` whatever their jobs take, to be backfilled (issue 18 item 7); the others
/// declare their jobs' true durations.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SimLying {
    pub share: f64,
    /// Gantry's answer (issue 18 item 7) on: a job past its declaration by the margin is no longer
    /// trusted (and preempted for the reservation it blocks if preemptible), and its owner's next
    /// declarations give way to the learned p80. Off: declarations trusted, as before it.
    pub checked: bool,
}

impl SimLying {
    /// The users who lie among those of `jobs`: the `share` of them (rounded, at least one) whose
    /// names hash lowest.
    pub fn liars(&self, jobs: &[TraceJob]) -> std::collections::BTreeSet<String> {
        let hash = |u: &str| {
            Rng::new(u.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
            }))
            .next_u64()
        };
        let mut users: Vec<&str> = jobs
            .iter()
            .map(|j| j.user.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        users.sort_by_key(|u| (hash(u), u.to_string()));
        let n = ((users.len() as f64 * self.share).round() as usize)
            .max(usize::from(self.share > 0.0))
            .min(users.len());
        users[..n].iter().map(|u| u.to_string()).collect()
    }
}

/// What a liar declares.
const LIE_MS: i64 = 1000;

/// How `gantry sim --preempt` models preemption: the lab's rules (the same `plan()` decides), which
/// jobs are preemptible, and what a preemption costs. A preempted job keeps its GPUs for the grace,
/// then goes back to the queue at its place; it loses the work since its last checkpoint (taken every
/// `checkpoint_every_ms` of its attempt, so on average half of that) plus the grace, and pays
/// `restart_cost_ms` when it starts again.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SimPreempt {
    pub rules: scheduler::PreemptRules,
    pub checkpoint_every_ms: i64,
    pub restart_cost_ms: i64,
    pub grace_ms: i64,
    /// The share of jobs that are preemptible (chosen by a fixed hash of the job's index).
    pub preemptible_share: f64,
    /// Jobs report each checkpoint (a `checkpoint` metrics point): the scheduler knows each victim's
    /// last one ([`scheduler::Victim::last_checkpoint_ms`]) and stops those that lose least. Off: it
    /// knows only their starts, as the engine until the metrics are wired to it.
    #[serde(default)]
    pub checkpoints_reported: bool,
}

impl SimPreempt {
    /// Whether job `j` of the trace is preemptible: a fixed hash, so every policy and seed agrees.
    pub fn preemptible(&self, j: usize) -> bool {
        self.preemptible_share >= 1.0
            || Rng::new((j as u64).wrapping_mul(0xA24B_AED4_963E_E407)).unit() < self.preemptible_share
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    pub policy: String,
    pub jobs: usize,
    pub gpus: u32,
    pub dropped_cpu_only: usize,
    pub dropped_too_big: usize,
    pub makespan_s: f64,
    /// max(total GPU-seconds / GPUs, latest arrival + its duration)
    pub lower_bound_s: f64,
    pub makespan_ratio: f64,
    /// Allocated GPU capacity / total, averaged over the time some job was waiting.
    pub alloc_share_while_waiting: f64,
    pub mean_wait_s: f64,
    pub p95_wait_s: f64,
    /// Mean wait by GPUs asked (1, 2, 4, 8...).
    pub mean_wait_by_gpus: BTreeMap<u32, f64>,
    /// Each user's share of the GPU time handed out while jobs were waiting (under contention).
    pub user_share: BTreeMap<String, f64>,
    /// Mean wait per user.
    pub mean_wait_by_user: BTreeMap<String, f64>,
    /// Scheduler calls made (for speed reporting).
    pub plan_calls: usize,
    /// Idle capacity while some job held a reservation, as a share of the waiting time (the part of
    /// `1 - alloc_share_while_waiting` that reservations account for).
    #[serde(default)]
    pub idle_share_while_reserving: f64,
    /// Mean over jobs asking for 4+ GPUs of how long the jobs running at their arrival still had to
    /// run: what even a perfect drain for them costs without preemption.
    #[serde(default)]
    pub big_drain_bound_s: f64,
    /// Idle capacity on GPUs that hold a shared job, as a share of the waiting time (fragments).
    #[serde(default)]
    pub idle_share_fragments: f64,
    /// Idle capacity while only jobs asking for 2+ GPUs waited (drains no policy can fill).
    #[serde(default)]
    pub idle_share_only_wide_waiting: f64,
    /// Preemptions made (`--preempt`).
    #[serde(default)]
    pub preemptions: usize,
    /// GPU-hours lost to preemption (work since the last checkpoint, the grace, the restart cost).
    #[serde(default)]
    pub gpu_hours_lost: f64,
    /// The same as a share of the trace's GPU-hours of work.
    #[serde(default)]
    pub lost_share: f64,
    /// Each job's start (ms on the virtual clock), for tests.
    #[serde(skip)]
    pub starts_ms: Vec<Option<i64>>,
}

const MS: f64 = 1000.0;

/// FGD packing weighs request shapes by their share of the last this-many submissions: enough that
/// a shape with a 10% share is known to ±2.6 points (95%), recent enough to follow a change of mix.
pub const SHAPE_WINDOW: usize = 500;

/// Replay `trace` through the scheduler on a virtual clock.
pub fn simulate(trace: &Trace, cfg: &SimConfig) -> Report {
    let jobs = &trace.jobs;
    let n = jobs.len();
    let gpu_views: Vec<GpuView> = (0..cfg.gpus)
        .map(|i| GpuView {
            index: i,
            memory_total: cfg.gpu_memory,
            ..Default::default()
        })
        .collect();
    let mem_of = |j: &TraceJob| {
        j.gpu_milli
            .map(|m| (cfg.gpu_memory as f64 * m as f64 / 1000.0).ceil() as u64)
    };
    let mut start: Vec<Option<i64>> = vec![None; n];
    let mut running: Vec<(i64, usize, Vec<u32>)> = vec![]; // (end ms, job, gpus)
    let mut queued: Vec<usize> = vec![];
    let mut next_arrival = 0usize;
    let mut now: i64 = 0;
    let mut plan_calls = 0usize;
    let mut waiting_time = 0.0f64;
    let mut alloc_integral = 0.0f64;
    let mut user_integral: HashMap<String, f64> = HashMap::new();
    let mut usage: HashMap<String, f64> = HashMap::new();
    let alloc_of = |running: &[(i64, usize, Vec<u32>)]| -> f64 {
        running
            .iter()
            .map(|(_, j, g)| jobs[*j].gpu_milli.map(|m| m as f64 / 1000.0).unwrap_or(g.len() as f64))
            .sum()
    };
    let arrival_ms = |j: &TraceJob| (j.submit_s * MS).round() as i64;
    // Exponentially weighted mean wait of started jobs (the engine keeps the same figure).
    let (mut typical, mut typical_n) = (0.0f64, 0.0f64);
    let mut sched = cfg.scheduler.clone();
    sched.explain_first = 0;
    let learn = cfg.learn_runtimes && !cfg.declared_runtimes && cfg.policy == Policy::Gantry;
    // Lying users (declared runtimes only): what each job declares, and, checked, each user's overruns.
    let lying = cfg
        .lying
        .as_ref()
        .filter(|_| cfg.declared_runtimes && cfg.policy == Policy::Gantry);
    let checked = lying.is_some_and(|l| l.checked);
    let liars = lying.map(|l| l.liars(jobs)).unwrap_or_default();
    let liar: Vec<bool> = jobs.iter().map(|j| liars.contains(&j.user)).collect();
    let declared_ms = |j: usize| {
        if liar[j] {
            LIE_MS
        } else {
            (jobs[j].duration_s * MS) as i64
        }
    };
    let mut overruns: HashMap<String, Vec<i64>> = HashMap::new();
    // Jobs with the same key share estimates: compute each class's once per change of the history.
    let (class_of, class_keys) = classes(jobs, &mem_of);
    let mut history = History::new();
    let mut cache: HashMap<usize, Option<Estimate>> = HashMap::new();
    let mut recent: std::collections::VecDeque<(u32, Option<u64>)> = Default::default();
    let mut reserving = false;
    let mut idle_reserved = 0.0f64;
    let (mut idle_frag, mut idle_wide) = (0.0f64, 0.0f64);
    let mut drain_bound: Vec<f64> = vec![];
    // Preemption: each job's work left (ms), its current attempt's start, when it was last queued
    // again, how long it waited after preemptions, its preemption times, and the loop guards.
    let pre = cfg.preempt.as_ref().filter(|_| cfg.policy == Policy::Gantry);
    let mut left_ms: Vec<i64> = jobs
        .iter()
        .map(|j| (j.duration_s * MS).round().max(1.0) as i64)
        .collect();
    let mut attempt_at: Vec<i64> = vec![0; n];
    let mut requeued_at: Vec<Option<i64>> = vec![None; n];
    let mut rewait_ms: Vec<i64> = vec![0; n];
    let mut end_ms: Vec<Option<i64>> = vec![None; n];
    let mut preempted_times: Vec<Vec<i64>> = vec![vec![]; n];
    let mut preempted_for: Vec<Vec<i64>> = vec![vec![]; n];
    let mut took_from: Vec<Vec<i64>> = vec![vec![]; n];
    let mut stopping: HashMap<usize, i64> = HashMap::new();
    let mut claims: BTreeMap<i64, Vec<u32>> = BTreeMap::new();
    let (mut preemptions, mut lost_gpu_ms) = (0usize, 0.0f64);
    if let Some(p) = pre {
        sched.preemption = Some(p.rules.clone());
    }
    loop {
        // Admit arrivals and completions at `now`.
        let arrived = next_arrival;
        while next_arrival < n && arrival_ms(&jobs[next_arrival]) <= now {
            queued.push(next_arrival);
            if jobs[next_arrival].gpus >= 4 {
                // No schedule without preemption starts it before the jobs running now end.
                drain_bound.push(running.iter().map(|r| r.0 - now).max().unwrap_or(0).max(0) as f64 / MS);
            }
            recent.push_back((jobs[next_arrival].gpus, mem_of(&jobs[next_arrival])));
            if recent.len() > SHAPE_WINDOW {
                recent.pop_front();
            }
            next_arrival += 1;
        }
        if next_arrival > arrived && sched.packing == scheduler::Packing::Fgd {
            sched.shapes = scheduler::shape_mix(recent.iter().copied());
        }
        for (end, j, _) in running.iter().filter(|r| r.0 <= now) {
            if checked {
                let d = declared_ms(*j);
                if end - attempt_at[*j] - d > scheduler::overrun_margin_ms(d, sched.overrun_margin_ms) {
                    overruns.entry(jobs[*j].user.clone()).or_default().push(*end);
                }
            }
            if stopping.remove(j).is_some() {
                // Preempted: back to its place in the queue.
                queued.push(*j);
                requeued_at[*j] = Some(*end);
                continue;
            }
            end_ms[*j] = Some(*end);
            if learn || checked {
                history.record(&class_keys[class_of[*j]], end - attempt_at[*j]);
                cache.clear();
            }
        }
        running.retain(|(end, _, _)| *end > now);
        if !queued.is_empty() {
            let mut est = |j: usize, elapsed: i64| -> Option<Estimate> {
                if elapsed == 0 {
                    *cache
                        .entry(class_of[j])
                        .or_insert_with(|| history.estimate(&class_keys[class_of[j]], 0))
                } else {
                    history.estimate(&class_keys[class_of[j]], elapsed)
                }
            };
            let state = scheduler::State {
                now_ms: now,
                gpus: gpu_views.clone(),
                running: running
                    .iter()
                    .map(|(end, j, g)| RunningJob {
                        job_id: *j as i64,
                        user: jobs[*j].user.clone(),
                        gpus: g.clone(),
                        gpu_memory: mem_of(&jobs[*j]),
                        expected_end_ms: if cfg.declared_runtimes {
                            Some(if liar[*j] { attempt_at[*j] + LIE_MS } else { *end })
                        } else if learn {
                            est(*j, now - attempt_at[*j]).map(|e| now + e.p50_ms)
                        } else {
                            None
                        },
                        needs: Default::default(), // traces have no CPU or RAM
                        victim: pre.filter(|p| p.preemptible(*j)).map(|_| scheduler::Victim {
                            priority: jobs[*j].priority,
                            started_ms: attempt_at[*j],
                            preempted_today: preempted_times[*j].iter().filter(|t| now - **t < 86_400_000).count()
                                as u32,
                            preempted_for: preempted_for[*j].clone(),
                            took_from: took_from[*j].clone(),
                            checkpoint_ms: None,
                            last_checkpoint_ms: pre
                                .filter(|p| p.checkpoints_reported && p.checkpoint_every_ms > 0)
                                .and_then(|p| {
                                    let ran = now - attempt_at[*j];
                                    (ran >= p.checkpoint_every_ms)
                                        .then(|| attempt_at[*j] + ran - ran % p.checkpoint_every_ms)
                                }),
                            stopping_for: stopping.get(j).copied(),
                        }),
                        declared: checked.then(|| scheduler::Declared {
                            started_ms: attempt_at[*j],
                            runtime_ms: declared_ms(*j),
                        }),
                    })
                    .collect(),
                queued: {
                    let mut v = queued_view(jobs, &queued, cfg, &mem_of, &arrival_ms, &usage, &requeued_at, |j| {
                        if learn {
                            est(j, 0)
                        } else {
                            None
                        }
                    });
                    if lying.is_some() {
                        for q in &mut v {
                            let j = q.job_id as usize;
                            let strikes = overruns.get(&jobs[j].user).map_or(0, |o| {
                                o.iter()
                                    .filter(|t| now - **t < crate::defaults::OVERRUN_WINDOW_MS)
                                    .count() as u32
                            });
                            q.expected_runtime_ms = if checked && strikes >= crate::defaults::OVERRUN_STRIKES {
                                crate::estimate::trusted_runtime(
                                    Some(declared_ms(j)),
                                    est(j, 0).as_ref(),
                                    strikes,
                                    crate::defaults::OVERRUN_STRIKES,
                                )
                            } else {
                                Some(declared_ms(j))
                            };
                        }
                    }
                    v
                },
                config: scheduler::Config {
                    claims: claims.iter().map(|(j, g)| (*j, g.clone())).collect(),
                    ..sched.clone()
                },
                typical_wait_ms: (typical_n > 0.0).then_some(typical as i64),
                host: None,
            };
            plan_calls += 1;
            let placements = match cfg.policy {
                Policy::Gantry => {
                    let p = scheduler::plan(&state);
                    reserving = p.waiting.iter().any(|w| !w.reserved.is_empty());
                    if let Some(m) = pre {
                        for d in &p.preempt {
                            let v = d.job as usize;
                            let Some(r) = running.iter_mut().find(|r| r.1 == v) else {
                                continue;
                            };
                            if stopping.contains_key(&v) {
                                continue;
                            }
                            // It keeps its GPUs for the grace, keeps the work up to its last checkpoint,
                            // and pays the restart cost when it runs again.
                            let ran = now - attempt_at[v];
                            let kept = if m.checkpoint_every_ms > 0 {
                                ran - ran % m.checkpoint_every_ms
                            } else {
                                0
                            };
                            let share = jobs[v].gpu_milli.map(|x| x as f64 / 1000.0).unwrap_or(r.2.len() as f64);
                            lost_gpu_ms += share * ((ran - kept) + m.grace_ms + m.restart_cost_ms) as f64;
                            left_ms[v] = (left_ms[v] - kept).max(1) + m.restart_cost_ms;
                            r.0 = now + m.grace_ms.max(1);
                            stopping.insert(v, d.for_job);
                            claims.entry(d.for_job).or_default().extend(r.2.iter().copied());
                            preempted_times[v].push(now);
                            preempted_for[v].push(d.for_job);
                            took_from[d.for_job as usize].push(d.job);
                            preemptions += 1;
                        }
                    }
                    p.placements
                }
                Policy::Greedy => {
                    let mut s = state;
                    s.config.reserve_after_ms = i64::MAX;
                    s.config.use_runtimes = false;
                    scheduler::plan(&s).placements
                }
                Policy::Fifo | Policy::Serial => {
                    let mut s = state;
                    s.config.reserve_after_ms = i64::MAX;
                    s.config.use_runtimes = false;
                    let p = scheduler::plan(&s);
                    // Strict order: only jobs ahead of the first one that has to wait.
                    let order = scheduler::order(&s);
                    let first_waiting = p
                        .waiting
                        .first()
                        .and_then(|w| order.iter().position(|id| *id == w.job_id))
                        .unwrap_or(order.len());
                    let mut allowed: Vec<i64> = order[..first_waiting].to_vec();
                    if cfg.policy == Policy::Serial {
                        allowed.truncate(usize::from(running.is_empty()));
                    }
                    p.placements
                        .into_iter()
                        .filter(|pl| allowed.contains(&pl.job_id))
                        .collect()
                }
            };
            for p in placements {
                let j = p.job_id as usize;
                claims.remove(&p.job_id);
                let w = match requeued_at[j] {
                    Some(at) => {
                        rewait_ms[j] += now - at;
                        (now - at) as f64
                    }
                    None => {
                        start[j] = Some(now);
                        (now - arrival_ms(&jobs[j])) as f64
                    }
                };
                attempt_at[j] = now;
                typical_n += 1.0;
                typical += (w - typical) / typical_n.min(100.0);
                let end = now + left_ms[j];
                running.push((end, j, p.gpus));
                queued.retain(|q| *q != j);
            }
        }
        // Advance to the next event.
        let next_end = running.iter().map(|r| r.0).min();
        let next_arr = (next_arrival < n).then(|| arrival_ms(&jobs[next_arrival]));
        let next = match (next_end, next_arr) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => break,
        };
        // Reservations start at a time, not at an event: wake up for them too.
        let next = if cfg.policy == Policy::Gantry {
            queued
                .iter()
                .map(|q| {
                    requeued_at[*q]
                        .unwrap_or(arrival_ms(&jobs[*q]))
                        .saturating_add(cfg.scheduler.reserve_after_ms)
                })
                // A running job becomes preemptible once it ran `min_run`.
                .chain(pre.filter(|_| !queued.is_empty()).into_iter().flat_map(|p| {
                    let at = &attempt_at;
                    running.iter().map(move |r| at[r.1] + p.rules.min_run_ms)
                }))
                .filter(|t| *t > now && *t < next)
                .min()
                .unwrap_or(next)
        } else {
            next
        };
        if let Some(hl) = cfg.fair_share_half_life_s {
            let dt = (next - now) as f64;
            let decay = 0.5f64.powf(dt / (hl * MS));
            usage.values_mut().for_each(|u| *u *= decay);
            for (_, j, g) in &running {
                let a = jobs[*j].gpu_milli.map(|m| m as f64 / 1000.0).unwrap_or(g.len() as f64);
                *usage.entry(jobs[*j].user.clone()).or_default() += dt / 3_600_000.0 * a;
            }
        }
        if !queued.is_empty() {
            let dt = (next - now) as f64;
            waiting_time += dt;
            alloc_integral += dt * alloc_of(&running) / cfg.gpus as f64;
            if reserving {
                idle_reserved += dt * (1.0 - alloc_of(&running) / cfg.gpus as f64);
            }
            // Idle capacity on GPUs that hold a shared job (fragments) vs. on empty GPUs.
            let mut used = vec![0.0f64; cfg.gpus as usize];
            for (_, j, g) in &running {
                for x in g {
                    used[*x as usize] += jobs[*j].gpu_milli.map(|m| m as f64 / 1000.0).unwrap_or(1.0);
                }
            }
            let frag: f64 = used.iter().filter(|u| **u > 0.0).map(|u| (1.0 - u).max(0.0)).sum();
            idle_frag += dt * frag / cfg.gpus as f64;
            if queued.iter().all(|q| jobs[*q].gpus >= 2) {
                idle_wide += dt * (1.0 - alloc_of(&running) / cfg.gpus as f64);
            }
            for (_, j, g) in &running {
                let a = jobs[*j].gpu_milli.map(|m| m as f64 / 1000.0).unwrap_or(g.len() as f64);
                *user_integral.entry(jobs[*j].user.clone()).or_default() += dt * a;
            }
        }
        now = next;
    }
    let mut r = report(
        trace,
        cfg,
        &start,
        &rewait_ms,
        &end_ms,
        waiting_time,
        alloc_integral,
        user_integral,
        plan_calls,
    );
    r.starts_ms = start.clone();
    r.preemptions = preemptions;
    r.gpu_hours_lost = lost_gpu_ms / 3_600_000.0;
    let work: f64 = jobs.iter().map(gpu_seconds).sum::<f64>() / 3600.0;
    r.lost_share = if work > 0.0 { r.gpu_hours_lost / work } else { 0.0 };
    r.idle_share_while_reserving = if waiting_time > 0.0 {
        idle_reserved / waiting_time
    } else {
        0.0
    };
    r.idle_share_fragments = if waiting_time > 0.0 {
        idle_frag / waiting_time
    } else {
        0.0
    };
    r.idle_share_only_wide_waiting = if waiting_time > 0.0 {
        idle_wide / waiting_time
    } else {
        0.0
    };
    r.big_drain_bound_s = if drain_bound.is_empty() {
        0.0
    } else {
        drain_bound.iter().sum::<f64>() / drain_bound.len() as f64
    };
    r
}

#[allow(clippy::too_many_arguments)] // the simulator's whole state at one instant, each part borrowed apart
fn queued_view(
    jobs: &[TraceJob],
    queued: &[usize],
    cfg: &SimConfig,
    mem_of: &impl Fn(&TraceJob) -> Option<u64>,
    arrival_ms: &impl Fn(&TraceJob) -> i64,
    usage: &HashMap<String, f64>,
    requeued_at: &[Option<i64>],
    mut learned: impl FnMut(usize) -> Option<Estimate>,
) -> Vec<QueuedJob> {
    queued
        .iter()
        .map(|q| {
            let j = &jobs[*q];
            QueuedJob {
                job_id: *q as i64,
                user: j.user.clone(),
                priority: j.priority,
                submitted_at_ms: arrival_ms(j),
                gpus: j.gpus,
                gpu_memory: mem_of(j),
                not_before_ms: None,
                expected_runtime_ms: if cfg.declared_runtimes {
                    Some((j.duration_s * MS) as i64)
                } else {
                    learned(*q).map(|e| e.p50_ms)
                },
                user_usage: usage.get(&j.user).copied().unwrap_or(0.0),
                filter: Default::default(),
                needs: Default::default(),
                preempted_at_ms: requeued_at[*q],
            }
        })
        .collect()
}

/// The FGD paper's protocol, per seed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FgdReport {
    pub packing: String,
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub stop_at: f64,
    /// Allocated GPU capacity / total when the requests reached `stop_at` x capacity, per seed.
    pub alloc_ratio: Vec<f64>,
    /// Tasks that did not fit, per seed.
    pub failed: Vec<f64>,
}

/// FGD's evaluation protocol (Weng et al., ATC'23): tasks arrive in a shuffled order and never end;
/// each goes where the scheduler places it (on `nodes` machines: the machine where the packing rule
/// scores it best), or fails if it fits nowhere; stop once the requested GPUs reach `stop_at` x the
/// capacity, and report the share of GPU capacity allocated. Placement within a machine is `plan`'s.
pub fn simulate_fgd(
    trace: &Trace,
    gpus: u32,
    gpu_memory: u64,
    nodes: u32,
    cfg: &scheduler::Config,
    seeds: u64,
    stop_at: f64,
) -> FgdReport {
    let jobs = &trace.jobs;
    let mem_of = |j: &TraceJob| {
        j.gpu_milli
            .map(|m| (gpu_memory as f64 * m as f64 / 1000.0).ceil() as u64)
    };
    let demand = |j: &TraceJob| j.gpu_milli.map(|m| m as f64 / 1000.0).unwrap_or(j.gpus as f64);
    let capacity = (gpus * nodes) as f64;
    let mut out = FgdReport {
        packing: format!("{:?}", cfg.packing)
            .to_lowercase()
            .replace("bestfit", "best-fit")
            .replace("worstfit", "worst-fit"),
        nodes,
        gpus_per_node: gpus,
        stop_at,
        ..Default::default()
    };
    let views: Vec<GpuView> = (0..gpus)
        .map(|i| GpuView {
            index: i,
            memory_total: gpu_memory,
            ..Default::default()
        })
        .collect();
    for seed in 0..seeds {
        let mut order: Vec<usize> = (0..jobs.len()).collect();
        let mut rng = Rng::new(seed.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for i in (1..order.len()).rev() {
            order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        let mut running: Vec<Vec<RunningJob>> = vec![vec![]; nodes as usize];
        let (mut requested, mut allocated, mut failed) = (0.0f64, 0.0f64, 0usize);
        let mut config = cfg.clone();
        config.explain_first = 0;
        let mut seen: Vec<(u32, Option<u64>)> = vec![];
        for &j in &order {
            let job = &jobs[j];
            if requested + demand(job) > stop_at * capacity {
                break;
            }
            requested += demand(job);
            seen.push((job.gpus, mem_of(job)));
            if seen.len() > SHAPE_WINDOW {
                seen.remove(0);
            }
            if config.packing == scheduler::Packing::Fgd {
                config.shapes = scheduler::shape_mix(seen.iter().copied());
            }
            let q = QueuedJob {
                job_id: j as i64,
                user: job.user.clone(),
                priority: 0,
                submitted_at_ms: 0,
                gpus: job.gpus,
                gpu_memory: mem_of(job),
                not_before_ms: None,
                expected_runtime_ms: None,
                user_usage: 0.0,
                filter: Default::default(),
                needs: Default::default(),
                preempted_at_ms: None,
            };
            // (score, node, gpus): lower is better.
            let mut best: Option<(f64, usize, Vec<u32>)> = None;
            for (k, run) in running.iter().enumerate() {
                let state = scheduler::State {
                    now_ms: 0,
                    gpus: views.clone(),
                    running: run.clone(),
                    queued: vec![q.clone()],
                    config: config.clone(),
                    typical_wait_ms: None,
                    host: None,
                };
                let Some(p) = scheduler::plan(&state).placements.pop() else {
                    continue;
                };
                let view = |extra: Option<&[u32]>| -> Vec<(u64, bool, u64)> {
                    (0..gpus)
                        .map(|g| {
                            let mut on: Vec<(Option<u64>, bool)> = run
                                .iter()
                                .filter(|r| r.gpus.contains(&g))
                                .map(|r| (r.gpu_memory, true))
                                .collect();
                            if extra.is_some_and(|e| e.contains(&g)) {
                                on.push((q.gpu_memory, true));
                            }
                            if on.iter().any(|o| o.0.is_none()) {
                                (0, false, gpu_memory)
                            } else {
                                (
                                    gpu_memory - on.iter().map(|o| o.0.unwrap_or(0)).sum::<u64>().min(gpu_memory),
                                    on.is_empty(),
                                    gpu_memory,
                                )
                            }
                        })
                        .collect()
                };
                let after = view(Some(&p.gpus));
                let score = match config.packing {
                    scheduler::Packing::Fgd => {
                        scheduler::expected_fragmentation(&after, &config.shapes)
                            - scheduler::expected_fragmentation(&view(None), &config.shapes)
                    }
                    scheduler::Packing::BestFit => after.iter().map(|g| g.0 as f64).sum(),
                    scheduler::Packing::WorstFit => -after.iter().map(|g| g.0 as f64).sum::<f64>(),
                };
                if best.as_ref().is_none_or(|b| score < b.0) {
                    best = Some((score, k, p.gpus));
                }
            }
            match best {
                Some((_, k, g)) => {
                    allocated += demand(job);
                    running[k].push(RunningJob {
                        job_id: j as i64,
                        user: job.user.clone(),
                        gpus: g,
                        gpu_memory: mem_of(job),
                        expected_end_ms: None,
                        needs: Default::default(),
                        victim: None,
                        declared: None,
                    });
                }
                None => failed += 1,
            }
        }
        out.alloc_ratio.push(allocated / capacity);
        out.failed.push(failed as f64);
    }
    out
}

/// Each job's estimator class (jobs with equal keys) and the classes' keys.
fn classes(jobs: &[TraceJob], mem_of: &impl Fn(&TraceJob) -> Option<u64>) -> (Vec<usize>, Vec<JobKey>) {
    let mut ids: HashMap<JobKey, usize> = HashMap::new();
    let mut keys = vec![];
    let class_of = jobs
        .iter()
        .map(|j| {
            let k = JobKey {
                user: j.user.clone(),
                name: j.name.clone(),
                image: String::new(),
                gpus: j.gpus,
                gpu_memory: mem_of(j),
                cpus_milli: j.cpus_milli,
                memory: j.memory_mib << 20,
            };
            *ids.entry(k.clone()).or_insert_with(|| {
                keys.push(k);
                keys.len() - 1
            })
        })
        .collect();
    (class_of, keys)
}

/// A deterministic random stream (SplitMix64): the same seed gives the same perturbation everywhere.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Arrival perturbation for `--seeds`: seed 0 is the trace as recorded; seed k moves each arrival by
/// a uniform offset within ± one mean gap between arrivals (so neighbours swap and bursts spread a
/// little, while the day-scale shape of the load stays) and re-sorts.
pub fn perturb_arrivals(jobs: &mut [TraceJob], seed: u64) {
    if seed == 0 || jobs.len() < 2 {
        return;
    }
    let first = jobs.iter().map(|j| j.submit_s).fold(f64::INFINITY, f64::min);
    let last = jobs.iter().map(|j| j.submit_s).fold(f64::NEG_INFINITY, f64::max);
    let gap = (last - first) / (jobs.len() - 1) as f64;
    let mut rng = Rng::new(seed.wrapping_mul(0x2545_F491_4F6C_DD1D));
    for j in jobs.iter_mut() {
        j.submit_s = (j.submit_s + (2.0 * rng.unit() - 1.0) * gap).max(first);
    }
    jobs.sort_by(|a, b| a.submit_s.total_cmp(&b.submit_s));
}

/// Mean and 95% confidence half-width (Student's t) of `xs`.
pub fn mean_ci(xs: &[f64]) -> (f64, f64) {
    let n = xs.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    if n == 1 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    // Two-sided 97.5% quantiles of Student's t for 1..=30 degrees of freedom, then the normal's.
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    let t = T.get(n - 2).copied().unwrap_or(1.96);
    (mean, t * (var / n as f64).sqrt())
}

impl Report {
    /// Mean wait of jobs asking for 4 or more GPUs over that of 1-GPU jobs (`None`: no such jobs).
    pub fn big_over_one(&self) -> Option<f64> {
        let w1 = self.mean_wait_by_gpus.get(&1).copied().filter(|w| *w > 0.0)?;
        let big: Vec<f64> = self
            .mean_wait_by_gpus
            .iter()
            .filter(|(g, _)| **g >= 4)
            .map(|(_, w)| *w)
            .collect();
        (!big.is_empty()).then(|| big.iter().sum::<f64>() / big.len() as f64 / w1)
    }
}

#[allow(clippy::too_many_arguments)] // the run's results, each measured apart, into one row
fn report(
    trace: &Trace,
    cfg: &SimConfig,
    start: &[Option<i64>],
    rewait_ms: &[i64],
    end_ms: &[Option<i64>],
    waiting_time: f64,
    alloc_integral: f64,
    user_integral: HashMap<String, f64>,
    plan_calls: usize,
) -> Report {
    let jobs = &trace.jobs;
    let mut waits: Vec<f64> = vec![];
    let mut by_gpus: BTreeMap<u32, (f64, usize)> = BTreeMap::new();
    let mut by_user: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    let mut makespan = 0.0f64;
    for (k, (j, s)) in jobs.iter().zip(start).enumerate() {
        let Some(s) = s else { continue };
        // Every wait counts: before its first start and after each preemption.
        let w = (*s as f64 / MS - j.submit_s).max(0.0) + rewait_ms.get(k).copied().unwrap_or(0) as f64 / MS;
        waits.push(w);
        let e = by_gpus.entry(j.gpus).or_default();
        e.0 += w;
        e.1 += 1;
        let u = by_user.entry(j.user.clone()).or_default();
        u.0 += w;
        u.1 += 1;
        makespan = makespan.max(match (rewait_ms.get(k), end_ms.get(k)) {
            (Some(r), Some(Some(e))) if *r > 0 || e - s > (j.duration_s * MS).round().max(1.0) as i64 => *e as f64 / MS,
            _ => *s as f64 / MS + j.duration_s,
        });
    }
    let total: f64 = jobs.iter().map(gpu_seconds).sum();
    let first = jobs.first().map(|j| j.submit_s).unwrap_or(0.0);
    let lb = (total / cfg.gpus as f64).max(jobs.iter().map(|j| j.submit_s + j.duration_s).fold(0.0, f64::max) - first);
    let makespan = makespan - first;
    waits.sort_by(f64::total_cmp);
    let mean = if waits.is_empty() {
        0.0
    } else {
        waits.iter().sum::<f64>() / waits.len() as f64
    };
    let p95 = waits
        .get(((waits.len() as f64 * 0.95).ceil() as usize).saturating_sub(1))
        .copied()
        .unwrap_or(0.0);
    Report {
        policy: format!("{:?}", cfg.policy).to_lowercase()
            + if cfg.declared_runtimes { "+runtimes" } else { "" }
            + match &cfg.lying {
                Some(l) if cfg.declared_runtimes && l.checked => "+liars+checked",
                Some(_) if cfg.declared_runtimes => "+liars",
                _ => "",
            }
            + if cfg.fair_share_half_life_s.is_some() {
                "+fairshare"
            } else {
                ""
            }
            + if cfg.preempt.is_some() && cfg.policy == Policy::Gantry {
                "+preempt"
            } else {
                ""
            },
        jobs: jobs.len(),
        gpus: cfg.gpus,
        dropped_cpu_only: trace.dropped_cpu_only,
        dropped_too_big: trace.dropped_too_big,
        makespan_s: makespan,
        lower_bound_s: lb,
        makespan_ratio: if lb > 0.0 { makespan / lb } else { 1.0 },
        alloc_share_while_waiting: if waiting_time > 0.0 {
            alloc_integral / waiting_time
        } else {
            1.0
        },
        mean_wait_s: mean,
        p95_wait_s: p95,
        mean_wait_by_gpus: by_gpus.into_iter().map(|(g, (s, c))| (g, s / c as f64)).collect(),
        mean_wait_by_user: by_user.into_iter().map(|(u, (s, c))| (u, s / c as f64)).collect(),
        user_share: {
            let sum: f64 = user_integral.values().sum();
            user_integral
                .into_iter()
                .map(|(u, s)| (u, if sum > 0.0 { s / sum } else { 0.0 }))
                .collect()
        },
        plan_calls,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::Config;

    fn run(csv: &str, gpus: u32, policy: Policy) -> Report {
        let t = parse_trace(csv, gpus).unwrap();
        let mut cfg = SimConfig {
            gpus,
            gpu_memory: 32 << 30,
            policy,
            declared_runtimes: false,
            scheduler: Default::default(),
            fair_share_half_life_s: None,
            learn_runtimes: false,
            preempt: None,
            lying: None,
        };
        cfg.scheduler.reserve_after_ms = 3_600_000;
        simulate(&t, &cfg)
    }

    const TWO: &str = "submit_s,duration_s,gpus,gpu_memory,user,priority\n0,10,1,,a,0\n0,10,1,,b,0\n";
    // A needs 1 GPU, B (arriving at 1 s) needs both, C (at 2 s) needs 1: B blocks C under strict FIFO.
    const HOL: &str = "submit_s,duration_s,gpus,gpu_memory,user,priority\n0,10,1,,a,0\n1,10,2,,a,0\n2,5,1,,a,0\n";

    #[test]
    fn serial_runs_one_at_a_time() {
        let r = run(TWO, 2, Policy::Serial);
        assert_eq!((r.makespan_s, r.lower_bound_s, r.mean_wait_s), (20.0, 10.0, 5.0));
        let r = run(TWO, 2, Policy::Fifo);
        assert_eq!((r.makespan_s, r.mean_wait_s, r.makespan_ratio), (10.0, 0.0, 1.0));
    }

    #[test]
    fn fifo_blocks_behind_the_head_and_greedy_backfills() {
        let f = run(HOL, 2, Policy::Fifo);
        assert_eq!(f.makespan_s, 25.0);
        assert_eq!(f.mean_wait_s, 9.0); // (0 + 9 + 18) / 3
                                        // Waiting from 1 s to 20 s: 9 s with 1 of 2 GPUs busy, 10 s with both.
        assert!(
            (f.alloc_share_while_waiting - 14.5 / 19.0).abs() < 1e-9,
            "{}",
            f.alloc_share_while_waiting
        );
        let g = run(HOL, 2, Policy::Greedy);
        assert_eq!((g.makespan_s, g.mean_wait_s), (20.0, 3.0));
        assert_eq!(g.mean_wait_by_gpus[&2], 9.0);
        assert_eq!(g.p95_wait_s, 9.0);
    }

    #[test]
    fn lower_bound_is_work_or_latest_finish() {
        let r = run("submit_s,duration_s,gpus\n0,100,1\n50,10,1\n", 1, Policy::Gantry);
        assert_eq!((r.lower_bound_s, r.makespan_s), (110.0, 110.0));
        let r = run("submit_s,duration_s,gpus\n0,10,1\n500,10,1\n", 2, Policy::Gantry);
        assert_eq!(r.lower_bound_s, 510.0);
    }

    #[test]
    fn reservation_stops_starvation_of_a_big_job() {
        // GPU 0 busy for 100 s; a 2-GPU job arrives; a stream of 1-GPU jobs keeps GPU 1 busy.
        let mut csv = String::from("submit_s,duration_s,gpus\n0,100,1\n1,10,2\n");
        for i in 0..40 {
            csv += &format!("{},20,1\n", 2 + i * 5);
        }
        let t = parse_trace(&csv, 2).unwrap();
        let mut cfg = SimConfig {
            gpus: 2,
            gpu_memory: 1 << 30,
            policy: Policy::Greedy,
            declared_runtimes: false,
            scheduler: Default::default(),
            fair_share_half_life_s: None,
            learn_runtimes: false,
            preempt: None,
            lying: None,
        };
        let greedy = simulate(&t, &cfg);
        cfg.policy = Policy::Gantry;
        cfg.scheduler.reserve_after_ms = 30_000;
        let gantry = simulate(&t, &cfg);
        let big = |r: &Report| r.mean_wait_by_gpus[&2];
        assert!(
            big(&gantry) < big(&greedy),
            "gantry {} vs greedy {}",
            big(&gantry),
            big(&greedy)
        );
        assert!(
            big(&gantry) <= 100.0,
            "starts once GPU 0 frees at 100 s: {}",
            big(&gantry)
        );
    }

    /// Issue 18 item 7 on the lab week (4 users, 4 GPUs): one user declaring 1 s on every job gains
    /// by it while declarations are trusted, and not once overruns are checked.
    #[test]
    fn a_lie_pays_while_trusted_and_not_once_checked() {
        let t = parse_trace(include_str!("../../../traces/lab-week.csv"), 4).unwrap();
        let lying = |checked| Some(SimLying { share: 0.25, checked });
        assert_eq!(
            SimLying {
                share: 0.25,
                checked: true
            }
            .liars(&t.jobs)
            .len(),
            1,
            "one user of four"
        );
        let liar = SimLying {
            share: 0.25,
            checked: true,
        }
        .liars(&t.jobs)
        .into_iter()
        .next()
        .unwrap();
        let cfg = SimConfig {
            gpus: 4,
            gpu_memory: 24 << 30,
            policy: Policy::Gantry,
            declared_runtimes: true,
            scheduler: Default::default(),
            fair_share_half_life_s: None,
            learn_runtimes: true,
            preempt: None,
            lying: None,
        };
        let honest = simulate(&t, &cfg);
        let trusted = simulate(
            &t,
            &SimConfig {
                lying: lying(false),
                ..cfg.clone()
            },
        );
        let checked = simulate(
            &t,
            &SimConfig {
                lying: lying(true),
                ..cfg.clone()
            },
        );
        let wait = |r: &Report| r.mean_wait_by_user[&liar];
        assert!(
            wait(&trusted) < 0.8 * wait(&honest),
            "trusted, {liar}'s lie pays: {} s against {} s honest",
            wait(&trusted),
            wait(&honest)
        );
        assert!(
            wait(&checked) >= wait(&honest),
            "checked, it does not: {} s against {} s honest",
            wait(&checked),
            wait(&honest)
        );
        assert_eq!(
            (trusted.policy.as_str(), checked.policy.as_str()),
            ("gantry+runtimes+liars", "gantry+runtimes+liars+checked")
        );
    }

    #[test]
    fn shared_jobs_pack_and_count_as_fractions() {
        // Four quarter-GPU jobs share one GPU at once.
        let r = run(
            "submit_s,duration_s,gpus,gpu_memory\n0,10,1,250\n0,10,1,250\n0,10,1,250\n0,10,1,250\n",
            1,
            Policy::Gantry,
        );
        assert_eq!((r.makespan_s, r.mean_wait_s, r.lower_bound_s), (10.0, 0.0, 10.0));
    }

    #[test]
    fn alibaba_format_and_load_rescaling() {
        let csv = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
                   p0,1,1,1,1000,,LS,Running,0,100,0\np1,1,1,1,500,,LS,Running,100,200,100\np2,1,1,0,0,,LS,Running,5,9,5\np3,1,1,8,1000,,LS,Running,5,9,5\n";
        let mut t = parse_trace(csv, 4).unwrap();
        assert_eq!((t.jobs.len(), t.dropped_cpu_only, t.dropped_too_big), (2, 1, 1));
        assert_eq!(t.jobs[1].gpu_milli, Some(500));
        // 150 GPU-seconds offered over 100 s of arrivals; at load 1.0 on 1 GPU arrivals spread over 150 s.
        rescale_load(&mut t.jobs, 1, 1.0);
        assert_eq!(t.jobs[1].submit_s, 150.0);
    }

    #[test]
    fn fair_share_lets_a_light_user_ahead_of_a_heavy_one() {
        // ana queues ten 1-hour jobs at once; ben arrives a little later with two.
        let mut csv = String::from("submit_s,duration_s,gpus,gpu_memory,user,priority\n");
        for _ in 0..10 {
            csv += "0,3600,1,,ana,0\n";
        }
        csv += "60,3600,1,,ben,0\n60,3600,1,,ben,0\n";
        let t = parse_trace(&csv, 1).unwrap();
        let mut cfg = SimConfig {
            gpus: 1,
            gpu_memory: 1 << 30,
            policy: Policy::Gantry,
            declared_runtimes: false,
            scheduler: Default::default(),
            fair_share_half_life_s: None,
            learn_runtimes: false,
            preempt: None,
            lying: None,
        };
        cfg.scheduler.reserve_after_ms = i64::MAX;
        let plain = simulate(&t, &cfg);
        cfg.fair_share_half_life_s = Some(86_400.0);
        let fair = simulate(&t, &cfg);
        assert!(
            plain.mean_wait_by_user["ben"] > 9.0 * 3600.0,
            "without fair share ben waits for all of ana's jobs"
        );
        assert!(
            fair.mean_wait_by_user["ben"] < 2.0 * 3600.0,
            "with fair share ben goes next: {:?}",
            fair.mean_wait_by_user
        );
        assert_eq!(plain.makespan_s, fair.makespan_s, "same work, same end");
    }

    #[test]
    fn learned_estimates_never_see_the_jobs_own_duration() {
        // 2 GPUs. Short "a" jobs teach the estimator; a long-running blocker keeps GPU 0 busy; job X
        // (a 1-GPU "a" job) starts at some point. Whether X then runs 10 s or 10 hours must not change
        // anything that happens before it ends: not its own start, not anyone else's.
        let mut csv = String::from("submit_s,duration_s,gpus,gpu_memory,user,priority,name\n0,100000,1,,u,0,blocker\n");
        for i in 0..20 {
            csv += &format!("{},{},1,,u,0,a\n", 1 + i, 5 + i % 3);
        }
        csv += "80,2,2,,u,0,wide\n"; // needs both GPUs: waits for the drain, reserving
        csv += "81,DUR,1,,u,0,a\n"; // job X
        for i in 0..10 {
            csv += &format!("{},7,1,,u,0,a\n", 82 + i);
        }
        let run = |dur: &str| {
            let t = parse_trace(&csv.replace("DUR", dur), 2).unwrap();
            let mut cfg = SimConfig {
                gpus: 2,
                gpu_memory: 1 << 30,
                policy: Policy::Gantry,
                declared_runtimes: false,
                scheduler: Default::default(),
                fair_share_half_life_s: None,
                learn_runtimes: true,
                preempt: None,
                lying: None,
            };
            cfg.scheduler.reserve_after_ms = 5_000;
            cfg.scheduler.wide_reserve_factor = 0.0;
            simulate(&t, &cfg)
        };
        let (short, long) = (run("10"), run("36000"));
        let x = 22; // sorted by submit time: blocker, 20 "a", wide, X
        let xs = short.starts_ms[x].expect("X starts");
        assert_eq!(long.starts_ms[x], Some(xs), "X's own duration moved its start");
        for (i, (a, b)) in short.starts_ms.iter().zip(&long.starts_ms).enumerate() {
            if a.is_some_and(|a| a < xs + 10_000) {
                assert_eq!(a, b, "job {i} started differently before X could have ended");
            }
        }
        // And the estimates were in use: an oracle-free gantry differs from knowing nothing.
        let t = parse_trace(&csv.replace("DUR", "10"), 2).unwrap();
        let cfg = SimConfig {
            gpus: 2,
            gpu_memory: 1 << 30,
            policy: Policy::Gantry,
            declared_runtimes: false,
            scheduler: Config {
                reserve_after_ms: 5_000,
                wide_reserve_factor: 0.0,
                ..Default::default()
            },
            fair_share_half_life_s: None,
            learn_runtimes: false,
            preempt: None,
            lying: None,
        };
        assert_ne!(
            simulate(&t, &cfg).starts_ms,
            short.starts_ms,
            "learning changed nothing: the test would not catch a leak"
        );
    }

    #[test]
    fn preemption_starts_a_wide_job_early_and_counts_what_it_costs() {
        // Two 1-GPU jobs of 10 hours hold both GPUs; a 2-GPU job of 1 hour arrives at 60 s. Without
        // preemption it waits 10 hours. With it (reserve_after 30 min), the two are preempted at
        // 30 min + 60 s, keep their GPUs for the 1-minute grace, and lose the 31 minutes since their
        // last checkpoint (every 30 min: at 30 min) minus nothing, plus the grace and a 2-minute restart.
        let csv = "submit_s,duration_s,gpus\n0,36000,1\n0,36000,1\n60,3600,2\n";
        let t = parse_trace(csv, 2).unwrap();
        let rules = scheduler::PreemptRules {
            overdue: true,
            priority_gap: None,
            fair_share: false,
            min_run_ms: 600_000,
            max_per_day: 3,
        };
        let pre = SimPreempt {
            rules,
            checkpoint_every_ms: 1_800_000,
            restart_cost_ms: 120_000,
            grace_ms: 60_000,
            preemptible_share: 1.0,
            checkpoints_reported: false,
        };
        let mut cfg = SimConfig {
            gpus: 2,
            gpu_memory: 1 << 30,
            policy: Policy::Gantry,
            declared_runtimes: false,
            scheduler: Default::default(),
            fair_share_half_life_s: None,
            learn_runtimes: false,
            preempt: None,
            lying: None,
        };
        cfg.scheduler.reserve_after_ms = 1_800_000;
        let plain = simulate(&t, &cfg);
        assert_eq!((plain.mean_wait_by_gpus[&2], plain.preemptions), (36000.0 - 60.0, 0));
        cfg.preempt = Some(pre.clone());
        let p = simulate(&t, &cfg);
        assert_eq!(p.preemptions, 2);
        // Preempted at 1860 s, the GPUs free at 1920 s: the wide job waited 1860 s.
        assert_eq!(p.mean_wait_by_gpus[&2], 1860.0);
        // Each victim: 60 s of work since its checkpoint at 1800 s, 60 s grace, 120 s restart.
        assert!(
            (p.gpu_hours_lost - 2.0 * 240.0 / 3600.0).abs() < 1e-9,
            "{}",
            p.gpu_hours_lost
        );
        // They run again after the wide job (1920 + 3600 s) and finish their remaining work plus the restart.
        assert_eq!(p.makespan_s, 5520.0 + (36000.0 - 1800.0) + 120.0);
        // None preemptible: nothing happens.
        cfg.preempt = Some(SimPreempt {
            preemptible_share: 0.0,
            ..pre
        });
        assert_eq!(simulate(&t, &cfg).starts_ms, plain.starts_ms);
    }

    /// Issue 32 item 3: where jobs report their checkpoints, the victim is the one that loses least
    /// (the latest checkpoint), not the one that started last. Two 10-hour jobs on 2 GPUs, started at
    /// 0 and 25 min, checkpoint every 30 min of their attempt; a priority-10 job arrives at 61 min 40 s.
    #[test]
    fn reported_checkpoints_make_victims_that_lose_least() {
        let csv =
            "submit_s,duration_s,gpus,gpu_memory,user,priority\n0,36000,1,,a,0\n1500,36000,1,,b,0\n3700,600,1,,c,10\n";
        let t = parse_trace(csv, 2).unwrap();
        let pre = SimPreempt {
            rules: scheduler::PreemptRules {
                overdue: false,
                priority_gap: Some(10),
                fair_share: false,
                min_run_ms: 600_000,
                max_per_day: 3,
            },
            checkpoint_every_ms: 1_800_000,
            restart_cost_ms: 120_000,
            grace_ms: 60_000,
            preemptible_share: 1.0,
            checkpoints_reported: false,
        };
        let cfg = |pre: SimPreempt| SimConfig {
            gpus: 2,
            gpu_memory: 1 << 30,
            policy: Policy::Gantry,
            declared_runtimes: false,
            scheduler: Default::default(),
            fair_share_half_life_s: None,
            learn_runtimes: false,
            preempt: Some(pre),
            lying: None,
        };
        // Unaware: the job that ran least goes (b, 36 min 40 s in): 6 min 40 s since its checkpoint at
        // 55 min, plus the 1-minute grace and 2-minute restart.
        let blind = simulate(&t, &cfg(pre.clone()));
        // Aware: a, whose checkpoint at 60 min is the latest: 1 min 40 s lost, plus grace and restart.
        let aware = simulate(
            &t,
            &cfg(SimPreempt {
                checkpoints_reported: true,
                ..pre
            }),
        );
        assert_eq!((blind.preemptions, aware.preemptions), (1, 1));
        let h = |s: f64| s / 3600.0;
        assert!(
            (blind.gpu_hours_lost - h(400.0 + 180.0)).abs() < 1e-9,
            "{}",
            blind.gpu_hours_lost
        );
        assert!(
            (aware.gpu_hours_lost - h(100.0 + 180.0)).abs() < 1e-9,
            "{}",
            aware.gpu_hours_lost
        );
    }

    #[test]
    fn fair_share_is_reported_per_user() {
        let r = run(TWO, 1, Policy::Fifo);
        assert_eq!(r.user_share.len(), 1, "only a ran while b waited: {:?}", r.user_share);
        assert!(parse_trace("a,b\n1,2\n", 1).is_err());
    }
}
