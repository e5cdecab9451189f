//! FGD's evaluation protocol (Weng et al., ATC'23): [`simulate_fgd`] and its [`FgdReport`].

use super::*;

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
