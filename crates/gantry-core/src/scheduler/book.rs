//! Bookings (`gantry book`): a booking is a reservation of `gpus` GPUs (of a type) for one user
//! from its start to its end, that moves nothing already promised.
//!
//! Rules (pure, over [`Config::bookings`]):
//! - **Which GPUs**: each open booking (by start, then id) is given concrete GPUs each pass
//!   ([`assign`]): GPUs it accepts that no overlapping booking took and no outside process busies,
//!   preferring (while active) those its owner's jobs already hold, then free ones, then ones held
//!   only by preemptible jobs; (before it starts) free ones or ones whose jobs are expected to end by
//!   its start, then preemptible ones. The lowest index breaks ties, so the choice is stable.
//! - **Before its start**, another user's job may go on its GPUs only if it is preemptible
//!   ([`Config::preemptible`]) and would have run the lab's `min_run` by the start, or is expected to
//!   end by the start: its declared runtime, else a cautious learned one ([`Config::cautious_runtimes`]:
//!   p95 of its owner's runs of that name and shape, not the median the queue order uses). A runtime
//!   that is not its own (learned from other jobs, [`Config::unproven_runtimes`]) is not trusted.
//! - **From its start to its end**, only its owner's jobs and sessions go on its GPUs; others wait
//!   with "GPU 1 booked by alice until 18:00".
//! - **At its start**, other users' preemptible jobs on its GPUs are preempted
//!   ([`PreemptWhy::Booking`]) under the same guard rails as every preemption ([`may_take`]: `min_run`
//!   this attempt, fewer than `max_per_day` in a day); non-preemptible ones are never stopped: the
//!   booking gets their GPUs as they end (the jobs it waits for are [`Assigned::waiting_for`]).

#[allow(unused_imports)]
use super::*;

/// An open booking as the scheduler sees it (the engine leaves out closed and ended ones).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BookHold {
    pub id: i64,
    pub user: String,
    pub gpus: u32,
    #[serde(default)]
    pub filter: GpuFilter,
    pub start_ms: i64,
    pub end_ms: i64,
    /// Its start and end as people read them ("14:00", "18:00"; the engine formats them in its
    /// local time: the scheduler reads no clock and no time zone).
    pub from: String,
    pub until: String,
}

impl BookHold {
    pub fn active(&self, now: i64) -> bool {
        self.start_ms <= now && now < self.end_ms
    }
    fn overlaps(&self, o: &BookHold) -> bool {
        self.start_ms < o.end_ms && o.start_ms < self.end_ms
    }
}

/// The GPUs a booking holds this pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assigned {
    pub booking: i64,
    pub gpus: Vec<u32>,
    /// While active: other users' non-preemptible jobs still on them.
    pub waiting_for: Vec<i64>,
}

/// A booking's hold on one GPU, as [`fit::choose`] checks it.
#[derive(Debug, Clone)]
pub(super) struct Held {
    user: String,
    start: i64,
    from: String,
    until: String,
}

/// The guard rails a booking's preemptions obey: the lab's `[preemption]` ones (the built-in ones
/// where preemption is off: then nothing is preemptible anyway).
fn guard_rails(state: &State) -> (i64, u32) {
    let r = state.config.preemption.clone().unwrap_or_default();
    (r.min_run_ms, r.max_per_day)
}

/// Whether a booking may preempt `r` now: it is preemptible and past the guard rails (it ran
/// `min_run` this attempt, and was preempted fewer than `max_per_day` times in the last day), or it
/// is being stopped already.
pub fn may_take(state: &State, r: &RunningJob) -> bool {
    let (min_run, max_per_day) = guard_rails(state);
    r.victim.as_ref().is_some_and(|v| {
        v.stopping_for.is_some() || (state.now_ms - v.started_ms >= min_run && v.preempted_today < max_per_day)
    })
}

/// Give each open booking concrete GPUs (see the module's rules).
pub fn assign(state: &State) -> Vec<Assigned> {
    let now = state.now_ms;
    let mut books: Vec<&BookHold> = state.config.bookings.iter().filter(|b| b.end_ms > now).collect();
    books.sort_by_key(|b| (b.start_ms, b.id));
    let mut out: Vec<(&BookHold, Assigned)> = vec![];
    for b in books {
        let active = b.active(now);
        let mut cands: Vec<(u8, u32)> = state
            .gpus
            .iter()
            .filter(|g| !g.external_busy && b.filter.eligible(&g.name, g.memory_total))
            .filter(|g| !out.iter().any(|(o, a)| o.overlaps(b) && a.gpus.contains(&g.index)))
            .map(|g| {
                let on: Vec<&RunningJob> = state.running.iter().filter(|r| r.gpus.contains(&g.index)).collect();
                let others: Vec<&&RunningJob> = on.iter().filter(|r| r.user != b.user).collect();
                let rank = if active {
                    if !on.is_empty() && others.is_empty() {
                        0
                    } else if others.is_empty() {
                        1
                    } else if others.iter().all(|r| may_take(state, r)) {
                        2
                    } else {
                        3
                    }
                } else if others
                    .iter()
                    .all(|r| r.expected_end_ms.is_some_and(|e| e <= b.start_ms))
                {
                    0
                } else if others
                    .iter()
                    .all(|r| r.victim.is_some() || r.expected_end_ms.is_some_and(|e| e <= b.start_ms))
                {
                    1
                } else {
                    2
                };
                (rank, g.index)
            })
            .collect();
        cands.sort();
        let gpus: Vec<u32> = cands.into_iter().take(b.gpus as usize).map(|c| c.1).collect();
        let waiting_for = if active {
            let mut w: Vec<i64> = state
                .running
                .iter()
                .filter(|r| r.user != b.user && !may_take(state, r) && r.gpus.iter().any(|g| gpus.contains(g)))
                .map(|r| r.job_id)
                .collect();
            w.sort();
            w
        } else {
            vec![]
        };
        out.push((
            b,
            Assigned {
                booking: b.id,
                gpus,
                waiting_for,
            },
        ));
    }
    out.into_iter().map(|(_, a)| a).collect()
}

/// Mark the assigned GPUs in `slots` so [`fit::choose`] keeps them for their bookings.
pub(super) fn mark(slots: &mut [Slot], state: &State, assigned: &[Assigned]) {
    for a in assigned {
        let Some(b) = state.config.bookings.iter().find(|b| b.id == a.booking) else {
            continue;
        };
        for s in slots.iter_mut().filter(|s| a.gpus.contains(&s.index)) {
            s.booked.push(Held {
                user: b.user.clone(),
                start: b.start_ms,
                from: b.from.clone(),
                until: b.until.clone(),
            });
        }
    }
}

/// Why `job` may not go on `slot` because of a booking, if so.
pub(super) fn refuses(slot: &Slot, job: &QueuedJob, ctx: &Ctx) -> Option<String> {
    for h in slot.booked.iter().filter(|h| h.user != job.user) {
        if h.start <= ctx.now {
            return Some(format!("GPU {} booked by {} until {}", slot.index, h.user, h.until));
        }
        // A runtime that is not its own (learned from other users' or other jobs' runs) is no
        // promise that it ends in time.
        let unproven = ctx.unproven.contains(&job.job_id);
        let rt = ctx
            .cautious
            .iter()
            .find(|c| c.0 == job.job_id)
            .map(|c| c.1)
            .or(job.expected_runtime_ms)
            .filter(|_| !unproven);
        let ends_in_time = ctx.use_runtimes && rt.is_some_and(|rt| ctx.now.saturating_add(rt) <= h.start);
        // A preemptible job must be able to run `min_run` before the start: the booking's start
        // preempts only past the guard rails, so one started later would hold the GPU into it.
        let preemptible = ctx.preemptible.contains(&job.job_id);
        let may_be_preempted = preemptible && ctx.now.saturating_add(ctx.min_run) <= h.start;
        if !ends_in_time && !may_be_preempted {
            let why = if preemptible && rt.is_none() {
                "this preemptible job could not run the lab's `min_run` before then"
            } else if unproven {
                "this job's runtime is not its own: none declared, and too few runs of it by you to learn it; set `expected_runtime` to go here"
            } else {
                "this job is not expected to end by then"
            };
            return Some(format!(
                "GPU {} booked by {} from {} ({why})",
                slot.index, h.user, h.from
            ));
        }
    }
    None
}

/// At an active booking's GPUs, other users' preemptible jobs are preempted for it.
pub(super) fn preempt_for(state: &State, assigned: &[Assigned], out: &mut Plan) {
    for a in assigned {
        let Some(b) = state.config.bookings.iter().find(|b| b.id == a.booking) else {
            continue;
        };
        if !b.active(state.now_ms) {
            continue;
        }
        for r in state
            .running
            .iter()
            .filter(|r| r.user != b.user && r.gpus.iter().any(|g| a.gpus.contains(g)))
        {
            let Some(v) = &r.victim else { continue };
            if v.stopping_for.is_some() || !may_take(state, r) || out.preempt.iter().any(|p| p.job == r.job_id) {
                continue;
            }
            out.preempt.push(Preempt {
                job: r.job_id,
                for_job: 0,
                why: PreemptWhy::Booking {
                    user: b.user.clone(),
                    booking: b.id,
                    span: format!("{}–{}", b.from, b.until),
                },
                gpus: a.gpus.clone(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const G: u64 = 1 << 30;
    const H: i64 = 3_600_000;

    fn gpus(n: u32) -> Vec<GpuView> {
        (0..n)
            .map(|i| GpuView {
                index: i,
                memory_total: 24 * G,
                ..Default::default()
            })
            .collect()
    }
    fn q(id: i64, user: &str, rt: Option<i64>) -> QueuedJob {
        QueuedJob {
            job_id: id,
            user: user.into(),
            priority: 0,
            submitted_at_ms: id,
            gpus: 1,
            gpu_memory: None,
            not_before_ms: None,
            expected_runtime_ms: rt,
            user_usage: 0.0,
            filter: GpuFilter::default(),
            needs: CpuRam::default(),
            preempted_at_ms: None,
        }
    }
    fn run(id: i64, user: &str, gpu: u32, end: Option<i64>, preemptible: bool) -> RunningJob {
        RunningJob {
            job_id: id,
            user: user.into(),
            gpus: vec![gpu],
            gpu_memory: None,
            expected_end_ms: end,
            needs: CpuRam::default(),
            victim: preemptible.then(Victim::default),
            declared: None,
        }
    }
    /// alice books `n` GPUs from `start` for 4 hours.
    fn alice(id: i64, n: u32, start: i64) -> BookHold {
        BookHold {
            id,
            user: "alice".into(),
            gpus: n,
            filter: GpuFilter::default(),
            start_ms: start,
            end_ms: start + 4 * H,
            from: "14:00".into(),
            until: "18:00".into(),
        }
    }
    fn st(
        now: i64,
        g: u32,
        running: Vec<RunningJob>,
        queued: Vec<QueuedJob>,
        bookings: Vec<BookHold>,
        preemptible: Vec<i64>,
    ) -> State {
        State {
            now_ms: now,
            gpus: gpus(g),
            running,
            queued,
            config: Config {
                bookings,
                preemptible,
                ..Config::default()
            },
            typical_wait_ms: None,
            host: None,
        }
    }
    fn placed(p: &Plan) -> Vec<(i64, Vec<u32>)> {
        let mut v: Vec<(i64, Vec<u32>)> = p.placements.iter().map(|p| (p.job_id, p.gpus.clone())).collect();
        v.sort();
        v
    }
    fn reason(p: &Plan, id: i64) -> String {
        p.waiting
            .iter()
            .find(|w| w.job_id == id)
            .map(|w| w.why())
            .unwrap_or_default()
    }

    #[test]
    fn placement_table() {
        struct Case {
            name: &'static str,
            state: State,
            want: Vec<(i64, Vec<u32>)>,
        }
        let start = 10 * H;
        let cases = vec![
            Case { name: "no booking: both GPUs used", state: st(0, 2, vec![], vec![q(1, "bob", None), q(2, "bob", None)], vec![], vec![]), want: vec![(1, vec![0]), (2, vec![1])] },
            Case {
                name: "a future booking of 1 of 2 GPUs: a job of unknown length takes only the other",
                state: st(0, 2, vec![], vec![q(1, "bob", None), q(2, "bob", None)], vec![alice(7, 1, start)], vec![]),
                want: vec![(1, vec![1])],
            },
            Case {
                name: "a job expected to end before the start goes on the booked GPU",
                state: st(0, 2, vec![], vec![q(1, "bob", None), q(2, "bob", Some(2 * H))], vec![alice(7, 1, start)], vec![]),
                want: vec![(1, vec![1]), (2, vec![0])],
            },
            Case {
                name: "a job expected to run past the start does not (it goes first, on the other GPU; nothing goes on GPU 0)",
                state: st(0, 2, vec![], vec![q(1, "bob", None), q(2, "bob", Some(11 * H))], vec![alice(7, 1, start)], vec![]),
                want: vec![(2, vec![1])],
            },
            Case {
                name: "a learned runtime counts at its cautious p95, not its median",
                state: {
                    let mut s = st(0, 2, vec![], vec![q(1, "bob", None), q(2, "bob", Some(2 * H))], vec![alice(7, 1, start)], vec![]);
                    s.config.cautious_runtimes = vec![(2, 11 * H)];
                    s
                },
                want: vec![(2, vec![1])],
            },
            Case {
                name: "a preemptible job goes on the booked GPU",
                state: st(0, 2, vec![], vec![q(1, "bob", None), q(2, "bob", None)], vec![alice(7, 1, start)], vec![2]),
                want: vec![(1, vec![1]), (2, vec![0])],
            },
            Case {
                name: "the owner's own job of unknown length may use her booked GPU early",
                state: st(0, 1, vec![], vec![q(1, "alice", None)], vec![alice(7, 1, start)], vec![]),
                want: vec![(1, vec![0])],
            },
            Case {
                name: "during the booking only the owner's jobs go on its GPUs, even short preemptible ones",
                state: st(start + H, 2, vec![], vec![q(1, "bob", Some(60_000)), q(2, "bob", None), q(3, "alice", None)], vec![alice(7, 1, start)], vec![1]),
                want: vec![(1, vec![1]), (3, vec![0])],
            },
            Case {
                name: "the owner's job goes first on a booked GPU the queue order would give to others",
                state: st(start, 1, vec![], vec![q(1, "bob", None), q(2, "alice", None)], vec![alice(7, 1, start)], vec![]),
                want: vec![(2, vec![0])],
            },
            Case {
                name: "after its end the GPUs are everyone's",
                state: st(start + 4 * H, 1, vec![], vec![q(1, "bob", None)], vec![alice(7, 1, start)], vec![]),
                want: vec![(1, vec![0])],
            },
            Case {
                name: "two overlapping bookings take different GPUs",
                state: st(0, 3, vec![], vec![q(1, "bob", None), q(2, "bob", None)], vec![alice(7, 1, start), BookHold { id: 8, user: "carol".into(), ..alice(8, 1, start + H) }], vec![]),
                want: vec![(1, vec![2])],
            },
            Case {
                name: "a booking asks for a GPU type: the other type stays free for anyone",
                state: {
                    let mut s = st(0, 2, vec![], vec![q(1, "bob", None), q(2, "bob", None)], vec![BookHold { filter: GpuFilter { gpu_type: Some("A100".into()), min_memory: None }, ..alice(7, 1, start) }], vec![]);
                    s.gpus[1].name = "NVIDIA A100".into();
                    s
                },
                want: vec![(1, vec![0])],
            },
        ];
        for c in cases {
            assert_eq!(placed(&plan(&c.state)), c.want, "{}", c.name);
        }
    }

    #[test]
    fn reasons_name_the_booking() {
        let start = 10 * H;
        let p = plan(&st(
            start + H,
            1,
            vec![],
            vec![q(1, "bob", None)],
            vec![alice(7, 1, start)],
            vec![],
        ));
        assert!(
            reason(&p, 1).contains("GPU 0 booked by alice until 18:00"),
            "{}",
            reason(&p, 1)
        );
        let p = plan(&st(
            0,
            1,
            vec![],
            vec![q(1, "bob", Some(11 * H))],
            vec![alice(7, 1, start)],
            vec![],
        ));
        assert!(
            reason(&p, 1).contains("GPU 0 booked by alice from 14:00 (this job is not expected to end by then)"),
            "{}",
            reason(&p, 1)
        );
    }

    #[test]
    fn at_its_start_preemptible_jobs_are_preempted_and_others_are_waited_for() {
        let start = 10 * H;
        // GPU 0: bob's preemptible job; GPU 1: carol's non-preemptible one. alice booked 2.
        let s = st(
            start,
            2,
            vec![run(1, "bob", 0, None, true), run(2, "carol", 1, None, false)],
            vec![],
            vec![alice(7, 2, start)],
            vec![],
        );
        let p = plan(&s);
        assert_eq!(p.preempt.len(), 1, "{:?}", p.preempt);
        assert_eq!(
            (p.preempt[0].job, &p.preempt[0].why.to_string()),
            (1, &"alice's booking 7 (14:00–18:00)".to_string())
        );
        assert_eq!(
            assign(&s),
            vec![Assigned {
                booking: 7,
                gpus: vec![0, 1],
                waiting_for: vec![2]
            }]
        );
        // Before the start nothing is preempted.
        let early = st(
            start - 1,
            2,
            s.running.clone(),
            vec![],
            vec![alice(7, 2, start)],
            vec![],
        );
        assert!(plan(&early).preempt.is_empty());
        // The owner's own preemptible job on it is not.
        let own = st(
            start,
            1,
            vec![run(1, "alice", 0, None, true)],
            vec![],
            vec![alice(7, 1, start)],
            vec![],
        );
        assert!(plan(&own).preempt.is_empty());
    }

    #[test]
    fn a_bookings_start_obeys_min_run_and_max_per_day() {
        let start = 10 * H;
        const M: i64 = 60_000;
        // bob's preemptible job started 1 minute before alice's booking; carol's was preempted 3
        // times today. Neither is preempted at the start (min_run 10 min, max_per_day 3): the
        // booking waits for them.
        let mut young = run(1, "bob", 0, None, true);
        young.victim.as_mut().unwrap().started_ms = start - M;
        let mut tired = run(2, "carol", 1, None, true);
        tired.victim.as_mut().unwrap().preempted_today = 3;
        let s = st(
            start,
            2,
            vec![young.clone(), tired],
            vec![],
            vec![alice(7, 2, start)],
            vec![],
        );
        assert!(plan(&s).preempt.is_empty(), "{:?}", plan(&s).preempt);
        assert_eq!(assign(&s)[0].waiting_for, vec![1, 2]);
        // Once bob's job has run its 10 minutes, it is preempted; carol's still is not.
        let later = st(
            start + 9 * M,
            2,
            s.running.clone(),
            vec![],
            vec![alice(7, 2, start)],
            vec![],
        );
        let p = plan(&later);
        assert_eq!(p.preempt.iter().map(|p| p.job).collect::<Vec<_>>(), vec![1]);
        // The lab's own guard rails count: with min_run 1 minute, bob's job goes at once.
        let mut lab = s.clone();
        lab.config.preemption = Some(PreemptRules {
            min_run_ms: M,
            ..PreemptRules::default()
        });
        assert_eq!(plan(&lab).preempt.iter().map(|p| p.job).collect::<Vec<_>>(), vec![1]);
    }

    #[test]
    fn before_the_start_a_preemptible_job_must_fit_min_run_and_a_runtime_must_be_its_own() {
        let start = 10 * H;
        const M: i64 = 60_000;
        // 5 minutes before the start, a preemptible job would run only 5 of its 10 minutes.
        let p = plan(&st(
            start - 5 * M,
            1,
            vec![],
            vec![q(1, "bob", None)],
            vec![alice(7, 1, start)],
            vec![1],
        ));
        assert!(placed(&p).is_empty());
        assert!(
            reason(&p, 1).contains("this preemptible job could not run the lab's `min_run` before then"),
            "{}",
            reason(&p, 1)
        );
        // 20 minutes before, it may.
        let p = plan(&st(
            start - 20 * M,
            1,
            vec![],
            vec![q(1, "bob", None)],
            vec![alice(7, 1, start)],
            vec![1],
        ));
        assert_eq!(placed(&p), vec![(1, vec![0])]);
        // A learned median of 1 hour from other jobs' runs is no promise to end by the start.
        let mut s = st(
            0,
            1,
            vec![],
            vec![q(1, "bob", Some(H))],
            vec![alice(7, 1, start)],
            vec![],
        );
        s.config.unproven_runtimes = vec![1];
        let p = plan(&s);
        assert!(placed(&p).is_empty());
        assert!(
            reason(&p, 1).contains("GPU 0 booked by alice from 14:00 (this job's runtime is not its own"),
            "{}",
            reason(&p, 1)
        );
        // Learned from its owner's own runs (cautious p95): trusted.
        s.config.unproven_runtimes = vec![];
        s.config.cautious_runtimes = vec![(1, 2 * H)];
        assert_eq!(placed(&plan(&s)), vec![(1, vec![0])]);
    }

    #[test]
    fn assignment_prefers_what_frees_in_time_and_never_counts_busy_outside_gpus() {
        let start = 10 * H;
        // GPU 0 runs bob's long job, GPU 1 a job ending before the start, GPU 2 busy outside Gantry.
        let mut s = st(
            0,
            3,
            vec![run(1, "bob", 0, None, false), run(2, "bob", 1, Some(start - 1), false)],
            vec![],
            vec![alice(7, 1, start)],
            vec![],
        );
        s.gpus[2].external_busy = true;
        assert_eq!(assign(&s)[0].gpus, vec![1]);
        // While active: the owner's GPU first.
        let s = st(
            start,
            2,
            vec![run(1, "alice", 1, None, false)],
            vec![],
            vec![alice(7, 1, start)],
            vec![],
        );
        assert_eq!(assign(&s)[0].gpus, vec![1]);
    }
}
