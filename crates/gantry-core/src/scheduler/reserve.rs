//! Reservations for jobs that waited too long, and the backfill that may use reserved GPUs.

#[allow(unused_imports)]
use super::*;

/// May `job` use a GPU reserved for another job? Only if it is known to end before that job starts.
pub(super) fn may_backfill(job: &QueuedJob, shadow: Option<i64>, ctx: &Ctx) -> bool {
    ctx.use_runtimes && matches!((job.expected_runtime_ms, shadow), (Some(rt), Some(sh)) if ctx.now + rt <= sh)
}

/// Reserve GPUs for a starving job: those expected to free up first (with runtimes), else those with
/// the fewest Gantry jobs. Returns the reserved indexes (empty if too few unreserved GPUs remain).
pub(super) fn reserve(slots: &mut [Slot], job: &QueuedJob, ctx: &Ctx) -> Vec<u32> {
    let mut cands: Vec<(i64, usize, u32)> = slots
        .iter()
        // A GPU whose outside use has not lasted a minute yet may be a job that just ended and is
        // still listed by the last sample: it stays reservable (else a backfill slips in for a pass).
        .filter(|s| {
            s.reserved_by.is_none()
                && !s.external_settled
                && job.filter.eligible(&s.name, s.total)
                && super::book::refuses(s, job, ctx).is_none()
        })
        .map(|s| {
            let free_at = if ctx.use_runtimes {
                s.free_at(ctx.now).unwrap_or(i64::MAX)
            } else {
                0
            };
            (
                free_at,
                s.shared_jobs.len() + usize::from(s.exclusive_by.is_some()),
                s.index,
            )
        })
        .collect();
    if cands.len() < job.gpus as usize {
        return vec![];
    }
    cands.sort();
    let chosen: Vec<(i64, usize, u32)> = cands.into_iter().take(job.gpus as usize).collect();
    // The job can start when the last of its GPUs frees up.
    let shadow = chosen.iter().map(|c| c.0).max().filter(|t| *t != i64::MAX);
    let mut idx: Vec<u32> = chosen.iter().map(|c| c.2).collect();
    for s in slots.iter_mut().filter(|s| idx.contains(&s.index)) {
        s.reserved_by = Some((job.job_id, shadow));
    }
    idx.sort();
    idx
}

// (topology)

#[cfg(test)]
mod drain_tests {
    use super::*;
    const G: u64 = 1 << 30;

    pub(super) fn gpus(n: u32) -> Vec<GpuView> {
        (0..n)
            .map(|i| GpuView {
                index: i,
                memory_total: 32 * G,
                ..Default::default()
            })
            .collect()
    }
    pub(super) fn q(id: i64, gpus: u32, rt: Option<i64>, at: i64) -> QueuedJob {
        QueuedJob {
            job_id: id,
            user: "ada".into(),
            priority: 0,
            submitted_at_ms: at,
            gpus,
            gpu_memory: None,
            not_before_ms: None,
            expected_runtime_ms: rt,
            user_usage: 0.0,
            filter: GpuFilter::default(),
            needs: CpuRam::default(),
            preempted_at_ms: None,
        }
    }
    pub(super) fn run(id: i64, gpu: u32, end: i64) -> RunningJob {
        RunningJob {
            job_id: id,
            user: "ada".into(),
            gpus: vec![gpu],
            gpu_memory: None,
            expected_end_ms: Some(end),
            needs: CpuRam::default(),
            victim: None,
            declared: None,
        }
    }

    #[test]
    pub(super) fn short_jobs_backfill_a_drain() {
        let h = 3_600_000;
        let running: Vec<RunningJob> = (0..7).map(|g| run(100 + g as i64, g, 1000 * h)).collect();
        let s = State {
            now_ms: 100 * h,
            gpus: gpus(8),
            running,
            queued: vec![q(1, 8, Some(h), 0), q(2, 1, Some(h), 50 * h)],
            config: Config {
                reserve_after_ms: h,
                drain_limit_factor: None,
                ..Config::default()
            },
            typical_wait_ms: Some(10 * h),
            host: None,
        };
        let p = plan(&s);
        assert_eq!(p.waiting[0].reserved.len(), 8, "{p:?}");
        assert_eq!(
            p.placements,
            vec![Placement {
                job_id: 2,
                gpus: vec![7]
            }],
            "{p:?}"
        );
    }
}

#[cfg(test)]
mod fgd_and_reservation_tests {
    use super::*;
    const G: u64 = 1 << 30;
    const H: i64 = 3_600_000;

    pub(super) fn gpus(n: u32) -> Vec<GpuView> {
        (0..n)
            .map(|i| GpuView {
                index: i,
                memory_total: 32 * G,
                ..Default::default()
            })
            .collect()
    }
    pub(super) fn q(id: i64, gpus: u32, mem: Option<u64>, at: i64, rt: Option<i64>) -> QueuedJob {
        QueuedJob {
            job_id: id,
            user: "ada".into(),
            priority: 0,
            submitted_at_ms: at,
            gpus,
            gpu_memory: mem,
            not_before_ms: None,
            expected_runtime_ms: rt,
            user_usage: 0.0,
            filter: GpuFilter::default(),
            needs: CpuRam::default(),
            preempted_at_ms: None,
        }
    }
    pub(super) fn run(id: i64, gpus: &[u32], mem: Option<u64>, end: Option<i64>) -> RunningJob {
        RunningJob {
            job_id: id,
            user: "ada".into(),
            gpus: gpus.to_vec(),
            gpu_memory: mem,
            expected_end_ms: end,
            needs: CpuRam::default(),
            victim: None,
            declared: None,
        }
    }
    pub(super) fn state(n: u32, running: Vec<RunningJob>, queued: Vec<QueuedJob>, now: i64) -> State {
        // The mechanisms one at a time: aging on, no drain limit (the defaults are tested below).
        State {
            now_ms: now,
            gpus: gpus(n),
            running,
            queued,
            config: Config {
                reserve_after_ms: H,
                age_narrow: true,
                drain_limit_factor: None,
                ..Config::default()
            },
            typical_wait_ms: Some(H),
            host: None,
        }
    }

    #[test]
    pub(super) fn fragmentation_by_hand() {
        // GPU 0: 16 GiB free (a shared job there), GPU 1: empty. Shapes: half 1x16 GiB, half whole GPUs.
        let view = [(16 * G, false, 32 * G), (32 * G, true, 32 * G)];
        let half = |m: Option<u64>| Shape {
            gpus: 1,
            gpu_memory: m,
            weight: 0.5,
        };
        // 16 GiB jobs fit on both GPUs: no fragment. A whole-GPU job fits on GPU 1 only: GPU 0's 16 GiB is a fragment.
        assert_eq!(fragmentation(&view, &half(Some(16 * G))), 0);
        assert_eq!(fragmentation(&view, &half(None)), 16 * G);
        assert_eq!(
            expected_fragmentation(&view, &[half(Some(16 * G)), half(None)]),
            8.0 * G as f64
        );
        // An 8 GiB job on GPU 1 leaves no empty GPU: a whole-GPU job fits nowhere, all 40 GiB free are fragments.
        let after = [(16 * G, false, 32 * G), (24 * G, false, 32 * G)];
        assert_eq!(fragmentation(&after, &half(None)), 40 * G);
        // A 2-GPU whole shape on a machine with one empty GPU: cannot host it, everything free counts.
        assert_eq!(
            fragmentation(
                &view,
                &Shape {
                    gpus: 2,
                    gpu_memory: None,
                    weight: 1.0
                }
            ),
            48 * G
        );
    }

    #[test]
    pub(super) fn fgd_keeps_room_for_the_common_shape_where_best_fit_does_not() {
        // GPU 0 has 12 GiB free, GPU 1 has 9 GiB. A 4 GiB job arrives; recent requests are all 8 GiB.
        // Best fit: GPU 1 (5 GiB left, too little for an 8 GiB job: +5 GiB of fragments). FGD: GPU 0
        // (8 GiB left, still serves an 8 GiB job: no new fragment).
        let running = vec![run(8, &[0], Some(20 * G), None), run(9, &[1], Some(23 * G), None)];
        let mut s = state(2, running, vec![q(1, 1, Some(4 * G), 0, None)], 0);
        s.config.shapes = vec![Shape {
            gpus: 1,
            gpu_memory: Some(8 * G),
            weight: 1.0,
        }];
        s.config.packing = Packing::BestFit;
        assert_eq!(plan(&s).placements[0].gpus, vec![1]);
        s.config.packing = Packing::Fgd;
        assert_eq!(plan(&s).placements[0].gpus, vec![0]);
        // FGD with no known mix is best fit.
        s.config.shapes.clear();
        assert_eq!(plan(&s).placements[0].gpus, vec![1]);
        assert_eq!(
            shape_mix([(1, Some(8 * G)), (1, Some(8 * G)), (2, None), (0, None)]),
            vec![
                Shape {
                    gpus: 1,
                    gpu_memory: Some(8 * G),
                    weight: 2.0 / 3.0
                },
                Shape {
                    gpus: 2,
                    gpu_memory: None,
                    weight: 1.0 / 3.0
                }
            ]
        );
    }

    #[test]
    pub(super) fn reservation_decisions() {
        struct Case {
            name: &'static str,
            state: State,
            /// (job, reserved GPUs) for every job that holds a reservation; placements.
            reserved: Vec<(i64, Vec<u32>)>,
            placed: Vec<i64>,
        }
        let busy = |end: i64| vec![run(9, &[0], None, Some(end))];
        let shared = || vec![run(7, &[0, 1], None, Some(6 * H)), run(6, &[2], None, Some(100 * H))];
        let limited = |mut s: State, f: f64| {
            s.config.drain_limit_factor = Some(f);
            s
        };
        let cases = vec![
            Case {
                name: "a wide job past the threshold reserves; a short job backfills the free GPU",
                state: state(
                    2,
                    busy(10 * H),
                    vec![q(1, 2, None, 0, Some(H)), q(2, 1, None, 5 * H, Some(H))],
                    5 * H,
                ),
                reserved: vec![(1, vec![0, 1])],
                placed: vec![2],
            },
            Case {
                name: "a job that would outlast the drain may not backfill",
                state: state(
                    2,
                    busy(10 * H),
                    vec![q(1, 2, None, 0, Some(H)), q(2, 1, None, 5 * H, Some(20 * H))],
                    5 * H,
                ),
                reserved: vec![(1, vec![0, 1])],
                placed: vec![],
            },
            Case {
                name: "unknown runtimes never backfill a drain",
                state: state(
                    2,
                    busy(10 * H),
                    vec![q(1, 2, None, 0, Some(H)), q(2, 1, None, 5 * H, None)],
                    5 * H,
                ),
                reserved: vec![(1, vec![0, 1])],
                placed: vec![],
            },
            Case {
                name: "a wide job before the threshold (3 x typical wait) reserves nothing",
                state: state(
                    2,
                    busy(10 * H),
                    vec![q(1, 2, None, 0, Some(H)), q(2, 1, None, 0, Some(50 * H))],
                    2 * H,
                ),
                reserved: vec![],
                placed: vec![2],
            },
            Case {
                name: "an overdue 1-GPU job reserves nothing",
                state: state(
                    2,
                    vec![run(9, &[0], None, Some(10 * H)), run(8, &[1], None, Some(20 * H))],
                    vec![q(1, 1, None, 0, Some(H))],
                    5 * H,
                ),
                reserved: vec![],
                placed: vec![],
            },
            Case {
                name: "an overdue 1-GPU job goes before a younger shorter one",
                state: state(
                    2,
                    busy(10 * H),
                    vec![q(1, 1, None, 0, Some(50 * H)), q(2, 1, None, 4 * H, Some(H))],
                    5 * H,
                ),
                reserved: vec![],
                placed: vec![1],
            },
            Case {
                name: "drain limit: a drain expected to take longer than the job's wait is not started",
                state: limited(
                    state(
                        2,
                        busy(100 * H),
                        vec![q(1, 2, None, 0, Some(H)), q(2, 1, None, 5 * H, Some(500 * H))],
                        5 * H,
                    ),
                    1.0,
                ),
                reserved: vec![],
                placed: vec![2],
            },
            Case {
                name: "defaults: an overdue 1-GPU job reserves the GPU that frees first, when it frees soon",
                state: {
                    let mut s = state(
                        2,
                        vec![run(9, &[0], None, Some(7 * H)), run(8, &[1], None, Some(20 * H))],
                        vec![q(1, 1, None, 0, Some(H)), q(2, 1, None, 4 * H, Some(H))],
                        5 * H,
                    );
                    s.config.age_narrow = false;
                    s.config.drain_limit_factor = Some(1.0);
                    s
                },
                reserved: vec![(1, vec![0])],
                placed: vec![],
            },
            Case {
                name: "defaults: ...and not when that takes longer than it waited",
                state: {
                    let mut s = state(
                        2,
                        vec![run(9, &[0], None, Some(70 * H)), run(8, &[1], None, Some(20 * H))],
                        vec![q(1, 1, None, 0, Some(H))],
                        5 * H,
                    );
                    s.config.age_narrow = false;
                    s.config.drain_limit_factor = Some(1.0);
                    s
                },
                reserved: vec![],
                placed: vec![],
            },
            Case {
                name: "drain limit: a short drain is",
                state: limited(
                    state(
                        2,
                        busy(8 * H),
                        vec![q(1, 2, None, 0, Some(H)), q(2, 1, None, 5 * H, Some(500 * H))],
                        5 * H,
                    ),
                    1.0,
                ),
                reserved: vec![(1, vec![0, 1])],
                placed: vec![],
            },
            // GPUs 0,1: a 2-GPU job ending at 6 h; GPU 2: a long job; GPU 3: free.
            Case {
                name: "a wide job shares the drain of the wide job running: it reserves before its threshold",
                state: state(
                    4,
                    shared(),
                    vec![q(1, 2, None, 5 * H, Some(H)), q(2, 1, None, 5 * H, Some(5 * H))],
                    5 * H,
                ),
                reserved: vec![(1, vec![0, 3])],
                placed: vec![],
            },
            Case {
                name: "...and without shared drains it waits its turn",
                state: {
                    let mut s = state(
                        4,
                        shared(),
                        vec![q(1, 2, None, 5 * H, Some(H)), q(2, 1, None, 5 * H, Some(5 * H))],
                        5 * H,
                    );
                    s.config.share_drains = false;
                    s
                },
                reserved: vec![],
                placed: vec![2],
            },
        ];
        for c in cases {
            let p = plan(&c.state);
            let reserved: Vec<(i64, Vec<u32>)> = p
                .waiting
                .iter()
                .filter(|w| !w.reserved.is_empty())
                .map(|w| (w.job_id, w.reserved.clone()))
                .collect();
            let placed: Vec<i64> = p.placements.iter().map(|p| p.job_id).collect();
            assert_eq!((reserved, placed), (c.reserved, c.placed), "{}", c.name);
        }
    }
}
