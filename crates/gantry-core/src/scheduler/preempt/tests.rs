use super::*;
const G: u64 = 1 << 30;
const M: i64 = 60_000;
const H: i64 = 60 * M;

fn gpus(n: u32) -> Vec<GpuView> {
    (0..n)
        .map(|i| GpuView {
            index: i,
            memory_total: 32 * G,
            ..Default::default()
        })
        .collect()
}
fn q(id: i64, user: &str, gpus: u32, prio: i32, at: i64) -> QueuedJob {
    QueuedJob {
        job_id: id,
        user: user.into(),
        priority: prio,
        submitted_at_ms: at,
        gpus,
        gpu_memory: None,
        not_before_ms: None,
        expected_runtime_ms: None,
        user_usage: 0.0,
        filter: GpuFilter::default(),
        needs: CpuRam::default(),
        preempted_at_ms: None,
    }
}
/// A preemptible job on `gpus` that started at `started`, priority 0.
fn pre(id: i64, user: &str, gpus: &[u32], started: i64) -> RunningJob {
    RunningJob {
        job_id: id,
        user: user.into(),
        gpus: gpus.to_vec(),
        gpu_memory: None,
        expected_end_ms: None,
        needs: CpuRam::default(),
        victim: Some(Victim {
            started_ms: started,
            ..Default::default()
        }),
        declared: None,
    }
}
fn fixed(id: i64, user: &str, gpus: &[u32]) -> RunningJob {
    RunningJob {
        victim: None,
        ..pre(id, user, gpus, 0)
    }
}
/// `r`, expected to end at `at` (declared or learned).
fn ends(r: RunningJob, at: i64) -> RunningJob {
    RunningJob {
        expected_end_ms: Some(at),
        ..r
    }
}
fn with(r: RunningJob, f: impl FnOnce(&mut Victim)) -> RunningJob {
    let mut r = r;
    f(r.victim.as_mut().unwrap());
    r
}
fn st(n: u32, running: Vec<RunningJob>, queued: Vec<QueuedJob>, now: i64, rules: PreemptRules) -> State {
    State {
        now_ms: now,
        gpus: gpus(n),
        running,
        queued,
        config: Config {
            reserve_after_ms: H,
            preemption: Some(rules),
            ..Config::default()
        },
        typical_wait_ms: None,
        host: None,
    }
}
fn only_overdue() -> PreemptRules {
    PreemptRules {
        overdue: true,
        priority_gap: None,
        fair_share: false,
        ..Default::default()
    }
}
fn only_priority(gap: i32) -> PreemptRules {
    PreemptRules {
        overdue: false,
        priority_gap: Some(gap),
        fair_share: false,
        ..Default::default()
    }
}
fn only_fair() -> PreemptRules {
    PreemptRules {
        overdue: false,
        priority_gap: None,
        fair_share: true,
        ..Default::default()
    }
}
fn decisions(s: &State) -> Vec<(i64, i64)> {
    let mut v: Vec<(i64, i64)> = plan(s).preempt.iter().map(|p| (p.job, p.for_job)).collect();
    v.sort();
    v
}

#[test]
fn preemption_rules_and_guard_rails() {
    struct Case {
        name: &'static str,
        state: State,
        /// (victim, for job)
        want: Vec<(i64, i64)>,
    }
    let now = 10 * H;
    let two_pre = || vec![pre(7, "bob", &[0], 0), pre(8, "bob", &[1], 0)];
    let cases = vec![
        // The overdue rule.
        Case { name: "overdue: a 2-GPU job past reserve_after preempts the two preemptible jobs holding its GPUs", state: st(2, two_pre(), vec![q(1, "ana", 2, 0, 0)], now, only_overdue()), want: vec![(7, 1), (8, 1)] },
        Case { name: "overdue: not before the threshold", state: st(2, two_pre(), vec![q(1, "ana", 2, 0, now - 30 * M)], now, only_overdue()), want: vec![] },
        Case { name: "overdue: a preempted job's wait counts from its preemption (it does not preempt back at once)", state: st(2, two_pre(), vec![QueuedJob { preempted_at_ms: Some(now - 5 * M), ..q(1, "ana", 2, 0, 0) }], now, only_overdue()), want: vec![] },
        Case { name: "never a non-preemptible job: one of the two holders is not, so nothing is preempted (never partially useless)", state: st(2, vec![pre(7, "bob", &[0], 0), fixed(8, "bob", &[1])], vec![q(1, "ana", 2, 0, 0)], now, only_overdue()), want: vec![] },
        Case { name: "off: rules off preempt nothing", state: st(2, two_pre(), vec![q(1, "ana", 2, 0, 0)], now, PreemptRules { overdue: false, priority_gap: None, fair_share: false, ..Default::default() }), want: vec![] },
        Case { name: "no [preemption] at all", state: { let mut s = st(2, two_pre(), vec![q(1, "ana", 2, 0, 0)], now, only_overdue()); s.config.preemption = None; s }, want: vec![] },
        // Guard rails.
        Case { name: "min_run: a job that started 5 minutes ago is not preempted", state: st(2, vec![pre(7, "bob", &[0], 0), pre(8, "bob", &[1], now - 5 * M)], vec![q(1, "ana", 2, 0, 0)], now, only_overdue()), want: vec![] },
        Case { name: "max_per_day: a job preempted 3 times today is not preempted again", state: st(2, vec![pre(7, "bob", &[0], 0), with(pre(8, "bob", &[1], 0), |v| v.preempted_today = 3)], vec![q(1, "ana", 2, 0, 0)], now, only_overdue()), want: vec![] },
        Case { name: "cheapest first: of three 1-GPU holders the one with the fewest GPU-minutes goes", state: st(3, vec![pre(7, "bob", &[0], 0), pre(8, "bob", &[1], now - 2 * H), pre(9, "bob", &[2], H)], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![(8, 1)] },
        Case { name: "cheapest first counts GPUs: a 2-GPU job 1 h in costs more than a 1-GPU job 1.5 h in", state: st(3, vec![pre(7, "bob", &[0, 1], now - H), pre(8, "bob", &[2], now - 90 * M)], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![(8, 1)] },
        Case { name: "cheapest first: among equals, the one that answered a checkpoint signal last", state: st(2, vec![with(pre(7, "bob", &[0], H), |v| v.checkpoint_ms = Some(2 * H)), with(pre(8, "bob", &[1], H), |v| v.checkpoint_ms = Some(5 * H))], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![(8, 1)] },
        // Checkpoint-aware victims (issue 32 item 3): what a victim loses counts from its last reported checkpoint.
        Case { name: "reported checkpoints: the job 3 h in that saved 5 minutes ago goes before the one 1 h in that saved none", state: st(2, vec![with(pre(7, "bob", &[0], now - 3 * H), |v| v.last_checkpoint_ms = Some(now - 5 * M)), pre(8, "bob", &[1], now - H)], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![(7, 1)] },
        Case { name: "reported checkpoints: a 2-GPU job's minutes since its checkpoint count twice", state: st(3, vec![with(pre(7, "bob", &[0, 1], now - 3 * H), |v| v.last_checkpoint_ms = Some(now - 40 * M)), with(pre(8, "bob", &[2], now - 3 * H), |v| v.last_checkpoint_ms = Some(now - 70 * M))], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![(8, 1)] },
        Case { name: "reported checkpoints: one from an earlier attempt counts as none (the attempt's start)", state: st(2, vec![with(pre(7, "bob", &[0], now - H), |v| v.last_checkpoint_ms = Some(now - 2 * H)), pre(8, "bob", &[1], now - 2 * H)], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![(7, 1)] },
        Case { name: "never partially: a 2-GPU job that needs both GPUs of a 2-GPU victim stops all of it (one decision)", state: st(2, vec![pre(7, "bob", &[0, 1], 0)], vec![q(1, "ana", 2, 0, 0)], now, only_overdue()), want: vec![(7, 1)] },
        // Never emptier (issue 32 item 1): a waiting rule's victims hold no more GPU capacity than the job will.
        Case { name: "no emptier: a 1-GPU job does not stop a 2-GPU victim (a GPU would idle until the victim fits again)", state: st(2, vec![pre(7, "bob", &[0, 1], 0)], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![] },
        Case { name: "no emptier: a job sharing 8 GiB of a GPU does not stop a whole-GPU job", state: st(1, vec![pre(7, "bob", &[0], 0)], vec![QueuedJob { gpu_memory: Some(8 * G), ..q(1, "ana", 1, 0, 0) }], now, only_overdue()), want: vec![] },
        Case { name: "no emptier: a job sharing 16 GiB stops a 16 GiB one beside a job that stays (same capacity)", state: st(1, vec![RunningJob { gpu_memory: Some(16 * G), ..pre(7, "bob", &[0], 0) }, RunningJob { gpu_memory: Some(16 * G), ..fixed(8, "bob", &[0]) }], vec![QueuedJob { gpu_memory: Some(16 * G), ..q(1, "ana", 1, 0, 0) }], now, only_overdue()), want: vec![(7, 1)] },
        Case { name: "no emptier: nor two 16 GiB jobs for one 16 GiB job", state: st(1, vec![RunningJob { gpu_memory: Some(16 * G), ..pre(7, "bob", &[0], 0) }, RunningJob { gpu_memory: Some(16 * G), ..pre(8, "bob", &[0], 0) }], vec![QueuedJob { gpu_memory: Some(24 * G), ..q(1, "ana", 1, 0, 0) }], now, only_overdue()), want: vec![] },
        Case { name: "no emptier: the priority rule is the lab's word and may (a session's share preempts a whole-GPU batch job)", state: st(1, vec![pre(7, "bob", &[0], 0)], vec![QueuedJob { gpu_memory: Some(8 * G), ..q(1, "ana", 1, 10, now) }], now, only_priority(10)), want: vec![(7, 1)] },
        // Fair to every user (issue 32 item 2): a waiting rule stops only jobs submitted after the waiting job.
        Case { name: "younger victims: an overdue job does not stop one submitted before it (it would go back ahead of everyone)", state: st(1, vec![with(pre(7, "bob", &[0], 0), |v| v.submitted_ms = -H)], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![] },
        Case { name: "younger victims: of two, the one submitted after the waiting job goes even if it ran longer", state: st(2, vec![with(pre(7, "bob", &[0], now - H), |v| v.submitted_ms = -H), with(pre(8, "bob", &[1], 0), |v| v.submitted_ms = H)], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![(8, 1)] },
        Case { name: "younger victims: submitted at the same time, the higher job id is the younger (bob's, older, stays)", state: st(1, vec![pre(7, "bob", &[0], 0)], vec![q(9, "ana", 1, 0, 0)], now, only_overdue()), want: vec![] },
        Case { name: "younger victims: the owner's own older job may go while no other user waits (one user's drain)", state: st(2, vec![with(pre(7, "ana", &[0, 1], 0), |v| v.submitted_ms = -H)], vec![q(1, "ana", 2, 0, 0)], now, only_overdue()), want: vec![(7, 1)] },
        Case { name: "younger victims: a 1-GPU job never stops the owner's older job (a reorder that only loses work)", state: st(1, vec![with(pre(7, "ana", &[0], 0), |v| v.submitted_ms = -H)], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![] },
        Case { name: "younger victims: not while another user's GPU job waits (it would go back ahead of it)", state: st(2, vec![with(pre(7, "ana", &[0, 1], 0), |v| v.submitted_ms = -H)], vec![q(1, "ana", 2, 0, 0), q(2, "bob", 1, 0, H)], now, only_overdue()), want: vec![] },
        Case { name: "no loop: a job may not preempt the job that preempted it", state: st(2, vec![with(pre(7, "bob", &[0, 1], 0), |v| v.took_from = vec![1])], vec![q(1, "ana", 2, 0, 0)], now, only_overdue()), want: vec![] },
        Case { name: "no loop: nor one it was preempted for before", state: st(2, vec![with(pre(7, "bob", &[0, 1], 0), |v| v.preempted_for = vec![1])], vec![q(1, "ana", 2, 0, 0)], now, only_overdue()), want: vec![] },
        Case { name: "never for a lower-priority job", state: st(2, vec![with(pre(7, "bob", &[0, 1], 0), |v| v.priority = 1)], vec![q(1, "ana", 2, 0, 0)], now, only_overdue()), want: vec![] },
        Case { name: "a free GPU is used before anyone is preempted", state: st(2, vec![pre(7, "bob", &[0], 0)], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![] },
        Case { name: "a victim already stopping for the job is not decided again", state: st(2, vec![with(pre(7, "bob", &[0], 0), |v| v.stopping_for = Some(1)), pre(8, "bob", &[1], 0)], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![] },
        // Worth it (issue 32): the overdue rule's waiting job gains more GPU time than its victims lose.
        Case { name: "worth it: a 1-GPU job does not stop one expected to end in 2 minutes that would lose 12", state: st(1, vec![ends(pre(7, "bob", &[0], now - 12 * M), now + 2 * M)], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![] },
        Case { name: "worth it: it stops one expected to end in 30 minutes that would lose 12", state: st(1, vec![ends(pre(7, "bob", &[0], now - 12 * M), now + 30 * M)], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![(7, 1)] },
        Case { name: "worth it: the last victim's end is the wait skipped (a 2-GPU job stops one ending in 8 minutes beside one ending in 10 hours)", state: st(2, vec![ends(pre(7, "bob", &[0], now - 12 * M), now + 8 * M), ends(pre(8, "bob", &[1], now - 12 * M), now + 10 * H)], vec![q(1, "ana", 2, 0, 0)], now, only_overdue()), want: vec![(7, 1), (8, 1)] },
        Case { name: "worth it: a 2-GPU job skipping 5 minutes (10 GPU-minutes) does not stop two jobs losing 12 minutes each", state: st(2, vec![ends(pre(7, "bob", &[0], now - 12 * M), now + 5 * M), ends(pre(8, "bob", &[1], now - 12 * M), now + 5 * M)], vec![q(1, "ana", 2, 0, 0)], now, only_overdue()), want: vec![] },
        Case { name: "worth it: the loss counts from the victim's reported checkpoint (3 h in, saved 5 minutes ago, 10 minutes left)", state: st(1, vec![ends(with(pre(7, "bob", &[0], now - 3 * H), |v| v.last_checkpoint_ms = Some(now - 5 * M)), now + 10 * M)], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![(7, 1)] },
        Case { name: "worth it: the same job without a reported checkpoint would lose 3 hours: it runs out its 10 minutes", state: st(1, vec![ends(pre(7, "bob", &[0], now - 3 * H), now + 10 * M)], vec![q(1, "ana", 1, 0, 0)], now, only_overdue()), want: vec![] },
        Case { name: "worth it: the priority rule is the lab's word and is not checked", state: st(1, vec![ends(pre(7, "bob", &[0], now - 12 * M), now + 2 * M)], vec![q(1, "ana", 1, 10, now)], now, only_priority(10)), want: vec![(7, 1)] },
        // The priority rule.
        Case { name: "priority: a job 10 above the victim preempts it at once (no wait needed)", state: st(1, vec![pre(7, "bob", &[0], 0)], vec![q(1, "ana", 1, 10, now)], now, only_priority(10)), want: vec![(7, 1)] },
        Case { name: "priority: 9 above is below the gap", state: st(1, vec![pre(7, "bob", &[0], 0)], vec![q(1, "ana", 1, 9, now)], now, only_priority(10)), want: vec![] },
        Case { name: "priority: never a non-preemptible job, whatever the gap", state: st(1, vec![fixed(7, "bob", &[0])], vec![q(1, "ana", 1, 100, now)], now, only_priority(10)), want: vec![] },
        Case { name: "priority: one victim serves one job; the second high job finds none", state: st(1, vec![pre(7, "bob", &[0], 0)], vec![q(1, "ana", 1, 10, now), q(2, "cho", 1, 10, now)], now, only_priority(10)), want: vec![(7, 1)] },
        Case { name: "priority: an interactive session (the engine's boost) preempts a preemptible batch job", state: st(1, vec![pre(7, "bob", &[0], 0)], vec![q(1, "ana", 1, SESSION_PRIORITY, now)], now, only_priority(10)), want: vec![(7, 1)] },
        // The fair-share rule.
        Case { name: "fair share: ana holds 0 of 2 (4 GPUs, 2 users), bob 4: bob's cheapest job goes", state: st(4, vec![pre(7, "bob", &[0], 0), pre(8, "bob", &[1], H), pre(9, "bob", &[2], 0), pre(10, "bob", &[3], 0)], vec![q(1, "ana", 1, 0, now)], now, only_fair()), want: vec![(8, 1)] },
        Case { name: "fair share: bob at his share (2 of 2) keeps his jobs", state: st(4, vec![fixed(5, "ana", &[0]), fixed(6, "ana", &[1]), pre(7, "bob", &[2], 0), pre(8, "bob", &[3], 0)], vec![q(1, "ana", 1, 0, now)], now, only_fair()), want: vec![] },
        Case { name: "fair share: not past the share — ana asking 3 of a share of 2", state: st(4, vec![pre(7, "bob", &[0], 0), pre(8, "bob", &[1], 0), pre(9, "bob", &[2], 0), pre(10, "bob", &[3], 0)], vec![q(1, "ana", 3, 0, now)], now, only_fair()), want: vec![] },
        Case { name: "fair share: a victim's owner is never pushed below the share (a 3-GPU job of bob's at 4 of 2)", state: st(4, vec![pre(7, "bob", &[0, 1, 2], 0), pre(8, "bob", &[3], 0)], vec![q(1, "ana", 2, 0, now)], now, only_fair()), want: vec![] },
    ];
    for c in cases {
        assert_eq!(decisions(&c.state), c.want, "{}", c.name);
    }
}

/// Issue 33: a GPU never idles for CPU/RAM held by preemptible CPU-only jobs while someone else's
/// GPU job waits. 4 GPUs, 1 CPU for jobs; each job asks 0.2 CPUs.
#[test]
fn cpu_only_work_is_preempted_for_a_gpu_job_whose_gpus_are_free() {
    let now = 10 * H;
    let fifth = CpuRam {
        cpus_milli: 200,
        memory: G,
    };
    let cpu = |r: RunningJob| RunningJob { needs: fifth, ..r };
    let bobs = |started: i64| -> Vec<RunningJob> { (11..=15).map(|i| cpu(pre(i, "bob", &[], started + i))).collect() };
    let alice = QueuedJob {
        needs: fifth,
        ..q(1, "ana", 1, 0, now)
    };
    let on = |running: Vec<RunningJob>, queued: Vec<QueuedJob>| {
        let mut s = st(4, running, queued, now, PreemptRules::default());
        s.host = Some(CpuRam {
            cpus_milli: 1000,
            memory: 5 * G,
        });
        s
    };
    type Case = (&'static str, State, Vec<(i64, i64)>);
    let cases: Vec<Case> = vec![
        (
            "bob's five preemptible CPU-only jobs hold every CPU: the latest started (cheapest among equals) goes",
            on(bobs(0), vec![alice.clone()]),
            vec![(15, 1)],
        ),
        (
            "not preemptible: nothing is preempted",
            on(
                bobs(0).into_iter().map(|r| RunningJob { victim: None, ..r }).collect(),
                vec![alice.clone()],
            ),
            vec![],
        ),
        (
            "not for the CPU-only jobs' own owner",
            on(
                bobs(0),
                vec![QueuedJob {
                    user: "bob".into(),
                    ..alice.clone()
                }],
            ),
            vec![],
        ),
        (
            "min_run protects a CPU-only job that just started",
            on(bobs(now - 5 * M), vec![alice.clone()]),
            vec![],
        ),
        (
            "the GPU job's GPUs are not free: this rule frees no GPU",
            on(
                [bobs(0), (0..4).map(|g| fixed(20 + g as i64, "cho", &[g])).collect()].concat(),
                vec![alice.clone()],
            ),
            vec![],
        ),
        (
            "preemption off: nothing",
            {
                let mut s = on(bobs(0), vec![alice.clone()]);
                s.config.preemption = None;
                s
            },
            vec![],
        ),
    ];
    for (name, state, want) in cases {
        assert_eq!(decisions(&state), want, "{name}");
    }
    let p = plan(&on(bobs(0), vec![alice]));
    assert_eq!(
        p.waiting[0].reason,
        "preempting job 15 for it (ana's 1-GPU job: its GPUs are free, the CPU or RAM it needs is held by \
         CPU-only jobs); starts when it has stopped"
    );
}

/// A preemptible job of `user`'s on `gpus` that declared `declared` ms and has run `past` ms
/// beyond it at `now`.
fn overrunning(id: i64, user: &str, gpus: &[u32], now: i64, declared: i64, past: i64) -> RunningJob {
    let started = now - declared - past;
    RunningJob {
        expected_end_ms: Some(started + declared),
        declared: Some(Declared {
            started_ms: started,
            runtime_ms: declared,
        }),
        ..pre(id, user, gpus, started)
    }
}

/// Issue 18 item 7: bob declared `expected_runtime: 1s` on a 53 s job to be backfilled; it ran
/// past its promise and blocked the reserved 4-GPU job, and nothing cut it off.
#[test]
fn a_job_that_overran_its_declared_runtime_is_preempted_for_the_reservation_it_blocks() {
    const S: i64 = 1000;
    let now = 10 * H;
    let none = PreemptRules {
        overdue: false,
        priority_gap: None,
        fair_share: false,
        ..Default::default()
    };
    // alice's 4-GPU job (job 1) has waited 10 h: GPUs 0-3 are reserved for it. GPUs 0-2 are free;
    // bob's job 12 on GPU 3 declared 1 s and has run 53 s past it.
    let issue = |rules: PreemptRules| {
        st(
            4,
            vec![overrunning(12, "bob", &[3], now, S, 53 * S)],
            vec![q(1, "alice", 4, 0, 0)],
            now,
            rules,
        )
    };
    struct Case {
        name: &'static str,
        state: State,
        want: Vec<(i64, i64)>,
    }
    let cases = vec![
        Case { name: "the issue: 53 s past a 1 s declaration, preemptible: preempted (min_run does not protect a broken promise)", state: issue(only_overdue()), want: vec![(12, 1)] },
        Case { name: "the overrun rule holds with every other rule off", state: issue(none.clone()), want: vec![(12, 1)] },
        Case { name: "main's behaviour (a margin never reached): the overdue rule waits for min_run, 10 min", state: { let mut s = issue(only_overdue()); s.config.overrun_margin_ms = i64::MAX / 4; s }, want: vec![] },
        Case { name: "within the margin (20 s past, margin 30 s): not yet", state: st(4, vec![overrunning(12, "bob", &[3], now, S, 20 * S)], vec![q(1, "alice", 4, 0, 0)], now, none.clone()), want: vec![] },
        Case { name: "a long declaration's margin is a tenth of it: 10 h declared, 30 min past, is not an overrun", state: st(4, vec![overrunning(12, "bob", &[3], now, 10 * H, 30 * M)], vec![q(1, "alice", 4, 0, 0)], now, none.clone()), want: vec![] },
        Case { name: "...70 min past is", state: st(4, vec![overrunning(12, "bob", &[3], now, 10 * H, 70 * M)], vec![q(1, "alice", 4, 0, 0)], now, none.clone()), want: vec![(12, 1)] },
        Case { name: "not preemptible: never stopped (demoted instead)", state: st(4, vec![RunningJob { victim: None, ..overrunning(12, "bob", &[3], now, S, 53 * S) }], vec![q(1, "alice", 4, 0, 0)], now, none.clone()), want: vec![] },
        Case { name: "only for a reservation: a job that has not waited past reserve_after preempts no one", state: st(4, vec![overrunning(12, "bob", &[3], now, S, 53 * S)], vec![q(1, "alice", 4, 0, now - 5 * M)], now, none.clone()), want: vec![] },
        Case { name: "the other guard rails hold: max_per_day", state: st(4, vec![with(overrunning(12, "bob", &[3], now, S, 53 * S), |v| v.preempted_today = 3)], vec![q(1, "alice", 4, 0, 0)], now, none.clone()), want: vec![] },
        Case { name: "the other guard rails hold: never for a lower-priority job", state: st(4, vec![with(overrunning(12, "bob", &[3], now, S, 53 * S), |v| v.priority = 5)], vec![q(1, "alice", 4, 0, 0)], now, none.clone()), want: vec![] },
        Case { name: "an honest job beside it still runs: preempting the liar alone would not let the job start, so not yet", state: st(4, vec![overrunning(12, "bob", &[3], now, S, 53 * S), RunningJob { victim: None, expected_end_ms: Some(now + H), ..pre(13, "cho", &[2], 0) }], vec![q(1, "alice", 4, 0, 0)], now, none.clone()), want: vec![] },
    ];
    for c in cases {
        assert_eq!(decisions(&c.state), c.want, "{}", c.name);
    }
    // What the user sees: the victim's reason and the waiting job's.
    let p = plan(&issue(only_overdue()));
    assert_eq!(
        p.preempt[0].why.to_string(),
        "job 12 ran 53s past its declared 1s runtime, on GPUs reserved for alice's 4-GPU job"
    );
    assert_eq!(p.waiting[0].reason, "preempting job 12 for it (job 12 ran 53s past its declared 1s runtime, on GPUs reserved for alice's 4-GPU job); starts when it has stopped");
    assert_eq!(p.waiting[0].reserved, vec![0, 1, 2, 3]);
    // Not preemptible: it runs on, and the reserved job says whom it waits for and why.
    let s = st(
        4,
        vec![RunningJob {
            victim: None,
            ..overrunning(12, "bob", &[3], now, S, 53 * S)
        }],
        vec![q(1, "alice", 4, 0, 0), q(2, "cho", 1, 0, now)],
        now,
        none,
    );
    let p = plan(&s);
    assert_eq!(
        p.placements,
        vec![],
        "the reservation holds GPUs 0-2 for it; nothing backfills on a broken promise: {p:?}"
    );
    let w = &p.waiting.iter().find(|w| w.job_id == 1).unwrap().reason;
    assert!(w.ends_with("; waits for job 12, which ran 53s past its declared 1s runtime (not preemptible, so it runs to its end; no job is backfilled on its promise any more)"), "{w}");
}

#[test]
fn the_waiting_job_says_why_and_keeps_the_gpus() {
    let s = st(
        2,
        vec![pre(7, "bob", &[0], 0), pre(8, "bob", &[1], 0)],
        vec![q(1, "alice", 2, 0, 0), q(2, "cho", 1, 0, 2 * H)],
        3 * H,
        only_overdue(),
    );
    let p = plan(&s);
    let w = p.waiting.iter().find(|w| w.job_id == 1).unwrap();
    assert_eq!(w.reserved, vec![0, 1]);
    assert!(
        w.reason
            .starts_with("preempting jobs 7, 8 for it (alice's 2-GPU job waited 3h"),
        "{}",
        w.reason
    );
    assert_eq!(
        p.preempt[0].why,
        PreemptWhy::Overdue {
            user: "alice".into(),
            gpus: 2,
            waited_ms: 3 * H
        }
    );
    // Next pass, while they stop: no new decision, the GPUs stay held, and then it starts.
    let stopping = |r: RunningJob| with(r, |v| v.stopping_for = Some(1));
    let s2 = State {
        running: vec![stopping(pre(7, "bob", &[0], 0)), stopping(pre(8, "bob", &[1], 0))],
        ..s.clone()
    };
    let p2 = plan(&s2);
    assert!(p2.preempt.is_empty(), "{p2:?}");
    let w = p2.waiting.iter().find(|w| w.job_id == 1).unwrap();
    assert_eq!(
        (w.reserved.clone(), w.reason.as_str()),
        (vec![0, 1], "starts when jobs 7, 8 have stopped (preempted for it)")
    );
    // Once they stopped, what was freed for it is its claim: a job ahead of it in the order
    // (priority 5) may not take it.
    let mut s3 = State { running: vec![], ..s };
    s3.config.reserve_after_ms = 100 * H; // no longer the starving job that goes first
    s3.queued.push(QueuedJob {
        priority: 5,
        ..q(3, "cho", 1, 0, 2 * H)
    });
    s3.config.claims = vec![(1, vec![0, 1])];
    assert_eq!(
        plan(&s3).placements,
        vec![Placement {
            job_id: 1,
            gpus: vec![0, 1]
        }]
    );
    s3.config.claims.clear();
    assert_eq!(
        plan(&s3).placements[0].job_id,
        3,
        "without the claim the job ahead takes a GPU"
    );
}

/// Found by the real-Docker test: a 2-GPU job preempting a 1-GPU job on a 2-GPU machine (the
/// other GPU free) must keep the free GPU too, or the preempted job comes straight back on it and
/// the 2-GPU job waits for its whole run.
#[test]
fn the_free_gpus_a_preempting_job_needs_are_kept_for_it_too() {
    let now = 10 * H;
    let s = st(
        2,
        vec![pre(7, "bob", &[0], 0)],
        vec![q(1, "ana", 2, 10, now)],
        now,
        only_priority(10),
    );
    let p = plan(&s);
    assert_eq!(
        p.preempt
            .iter()
            .map(|d| (d.job, d.for_job, d.gpus.clone()))
            .collect::<Vec<_>>(),
        [(7, 1, vec![0, 1])]
    );
    assert!(p.placements.is_empty(), "nothing takes the free GPU meanwhile: {p:?}");
    // Next pass: the victim stopped and is queued again, but GPU 0 still shows its process (until
    // the next sample), so job 1 cannot start yet. The claim the engine records from the
    // decision keeps GPU 1 for job 1 too: the victim does not come back on it.
    let mut s2 = st(
        2,
        vec![],
        vec![
            QueuedJob {
                preempted_at_ms: Some(now),
                ..q(7, "bob", 1, 0, 0)
            },
            q(1, "ana", 2, 10, now),
        ],
        now,
        only_priority(10),
    );
    s2.gpus[0].external_busy = true;
    s2.config.claims = vec![(1, p.preempt[0].gpus.clone())];
    assert_eq!(
        plan(&s2).placements,
        vec![],
        "the victim came back on a GPU kept for job 1"
    );
    // With only the victim's GPU claimed (the bug), it would have.
    s2.config.claims = vec![(1, vec![0])];
    assert_eq!(
        plan(&s2).placements,
        vec![Placement {
            job_id: 7,
            gpus: vec![1]
        }]
    );
    // Once GPU 0 reads free, job 1 starts on both.
    s2.gpus[0].external_busy = false;
    s2.config.claims = vec![(1, p.preempt[0].gpus.clone())];
    assert_eq!(
        plan(&s2).placements,
        vec![Placement {
            job_id: 1,
            gpus: vec![0, 1]
        }]
    );
}

#[test]
fn no_preemption_loop_over_passes() {
    // A (priority 10) preempts B (0). Then B, requeued, may never preempt A: not by priority
    // (lower), not by the overdue rule (A took from it; B's wait restarted), not by fair share
    // (its owner would have to be below the share while A's above).
    let rules = PreemptRules {
        overdue: true,
        priority_gap: Some(10),
        fair_share: true,
        ..Default::default()
    };
    let now = 10 * H;
    let s = st(
        1,
        vec![pre(2, "bob", &[0], 0)],
        vec![q(1, "ana", 1, 10, now)],
        now,
        rules.clone(),
    );
    assert_eq!(decisions(&s), vec![(2, 1)]);
    let later = now + 5 * H;
    let a_runs = RunningJob {
        victim: Some(Victim {
            priority: 10,
            started_ms: now,
            took_from: vec![2],
            ..Default::default()
        }),
        ..pre(1, "ana", &[0], now)
    };
    let b_waits = QueuedJob {
        preempted_at_ms: Some(now),
        ..q(2, "bob", 1, 0, 0)
    };
    let s = st(1, vec![a_runs.clone()], vec![b_waits.clone()], later, rules.clone());
    assert_eq!(decisions(&s), vec![]);
    // Even at the same priority and long overdue, the job A took from cannot take it back.
    let s = st(
        1,
        vec![RunningJob {
            victim: Some(Victim {
                priority: 0,
                ..a_runs.victim.clone().unwrap()
            }),
            ..a_runs
        }],
        vec![b_waits],
        later + 100 * H,
        rules,
    );
    assert_eq!(decisions(&s), vec![]);
}

/// A waiting job the cost check held back says so, with the victim's expected end and the work lost.
#[test]
fn a_job_not_worth_preempting_is_named_in_the_waiting_reason() {
    let now = 10 * H;
    let mut s = st(
        1,
        vec![ends(pre(7, "bob", &[0], now - 12 * M), now + 2 * M)],
        vec![q(1, "ana", 1, 0, 0)],
        now,
        only_overdue(),
    );
    s.config.explain_first = 10;
    let p = plan(&s);
    assert!(p.preempt.is_empty(), "{p:?}");
    let reason = &p.waiting.iter().find(|w| w.job_id == 1).unwrap().reason;
    assert!(
        reason.contains(
            "not preempting job 7: it is expected to end in 2m, too soon to be worth the 12m of work it would lose"
        ),
        "{reason}"
    );
}
