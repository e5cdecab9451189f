//! The simulator's tests: the policies on small traces and the lab week, lying users, shared GPUs,
//! the Alibaba format, fair share, learned estimates, preemption.

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
    let t = parse_trace(include_str!("../../../../traces/lab-week.csv"), 4).unwrap();
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

/// Issue 32 item 1: on a GPU-sharing workload, preemption never leaves GPUs emptier. Two whole-GPU
/// jobs of 10 hours hold both GPUs; quarter-GPU jobs queue behind them. A quarter-GPU job stopping a
/// whole-GPU one would leave three quarters of that GPU idle while the victim, needing a whole GPU,
/// waits for one to empty (and the machine then holds less than without preemption).
#[test]
fn preemption_never_lowers_the_allocated_share_on_shared_gpus() {
    let mut csv = "submit_s,duration_s,gpus,gpu_memory,user,priority\n0,36000,1,,a,0\n0,36000,1,,a,0\n".to_string();
    for i in 0..8 {
        csv += &format!("{},3600,1,250,b,0\n", 60 + i);
    }
    let t = parse_trace(&csv, 2).unwrap();
    let mut cfg = SimConfig {
        gpus: 2,
        gpu_memory: 32 << 30,
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
    cfg.preempt = Some(SimPreempt {
        rules: scheduler::PreemptRules::default(),
        checkpoint_every_ms: 1_800_000,
        restart_cost_ms: 120_000,
        grace_ms: 60_000,
        preemptible_share: 1.0,
        checkpoints_reported: false,
    });
    let p = simulate(&t, &cfg);
    assert!(
        p.alloc_share_while_waiting >= plain.alloc_share_while_waiting && p.makespan_s <= plain.makespan_s,
        "with preemption: share {} makespan {} ({} preemptions, {:?}); without: share {} makespan {}",
        p.alloc_share_while_waiting,
        p.makespan_s,
        p.preemptions,
        p.mechanisms,
        plain.alloc_share_while_waiting,
        plain.makespan_s
    );
    assert_eq!(p.mechanisms.shared_over_exclusive, 0, "{:?}", p.mechanisms);
}
