//! The run loop: [`simulate`] replays a trace through `scheduler::plan` on a virtual clock, with the
//! queue's view of each pass and the runtime estimator's job classes.

use super::report::report;
use super::trace::gpu_seconds;
use super::*;

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
    // What preemption did to the capacity (issue 32): each decision's victims and when, until its job starts.
    let mut mech = super::Mechanisms::default();
    type Victims = Vec<(usize, Vec<u32>)>;
    let mut decided: HashMap<usize, (i64, Victims)> = HashMap::new();
    let alloc_one = |j: usize, g: usize| jobs[j].gpu_milli.map(|m| m as f64 / 1000.0).unwrap_or(g as f64);
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
                            submitted_ms: arrival_ms(&jobs[*j]),
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
                            let w = d.for_job as usize;
                            if jobs[w].gpu_milli.is_some() && jobs[v].gpu_milli.is_none() {
                                mech.shared_over_exclusive += 1;
                            }
                            mech.own_user += usize::from(jobs[w].user == jobs[v].user);
                            mech.wider += usize::from(jobs[v].gpus > jobs[w].gpus);
                            mech.preempted_twice += usize::from(preempted_times[v].len() == 1);
                            decided
                                .entry(w)
                                .or_insert_with(|| (now, vec![]))
                                .1
                                .push((v, r.2.clone()));
                            // Every GPU it will start on, not only the victim's, as the engine keeps them
                            // (`Preempt::gpus`): else a free GPU beside the victims goes to another job and
                            // the claimed ones idle until the waiting job fits again (issue 32).
                            let c = claims.entry(d.for_job).or_default();
                            c.extend(r.2.iter().copied().chain(d.gpus.iter().copied()));
                            c.sort();
                            c.dedup();
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
                if let Some((at, vs)) = decided.remove(&j) {
                    mech.decision_to_start_h += (now - at) as f64 / 3_600_000.0;
                    mech.victims_unused += vs.iter().filter(|(_, g)| !g.iter().any(|x| p.gpus.contains(x))).count();
                    let given: f64 = vs.iter().map(|(v, g)| alloc_one(*v, g.len())).sum();
                    mech.alloc_given_up_gpus += (given - alloc_one(j, p.gpus.len())).max(0.0);
                }
                let w = match requeued_at[j] {
                    Some(at) => {
                        rewait_ms[j] += now - at;
                        mech.rewait_gpu_h += alloc_one(j, p.gpus.len()) * (now - at) as f64 / 3_600_000.0;
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
            let claimed: std::collections::BTreeSet<u32> = claims.values().flatten().copied().collect();
            mech.claim_idle_gpu_h += dt / 3_600_000.0
                * claimed
                    .iter()
                    .filter_map(|g| used.get(*g as usize))
                    .map(|u| (1.0 - u).max(0.0))
                    .sum::<f64>();
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
    r.mechanisms = mech;
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
