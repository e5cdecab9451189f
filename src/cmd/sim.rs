//! `gantry sim`: replay a workload trace through the scheduler on a virtual clock, and print the
//! policies' figures side by side.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use gantry_core::units::duration_brief_ms;

use crate::cli::SimArgs;
use crate::print::print_json;
use crate::term::{esc, outln};

/// `gantry sim`: the scheduler's policies side by side on a trace.
pub fn sim(a: &SimArgs, json: bool) -> Result<()> {
    let mut sched = gantry_core::scheduler::Config {
        reserve_after_ms: a.reserve_after.as_millis() as i64,
        reserve_factor: a.reserve_factor,
        ..Default::default()
    };
    if let Some(w) = a.wide_reserve_factor {
        sched.wide_reserve_factor = w;
    }
    sched.share_drains = a.share_drains == "on";
    sched.hrrn = a.order == "hrrn";
    sched.drain_limit_factor = match a.drain_limit.as_str() {
        "none" => None,
        f => Some(
            f.parse()
                .with_context(|| format!("--drain-limit {f:?}: a number or none"))?,
        ),
    };
    sched.age_narrow = match a.narrow.as_str() {
        "age" => true,
        "reserve" => false,
        n => bail!("unknown --narrow {n:?}: age or reserve"),
    };
    sched.packing = match a.packing.as_str() {
        "fgd" => gantry_core::scheduler::Packing::Fgd,
        "best-fit" => gantry_core::scheduler::Packing::BestFit,
        "worst-fit" => gantry_core::scheduler::Packing::WorstFit,
        p => bail!("unknown packing {p:?}: fgd, best-fit or worst-fit"),
    };
    let preempt = if a.preempt { Some(preempt_model(a)?) } else { None };
    if a.preempt_only && !a.preempt {
        bail!("--preempt-only needs --preempt");
    }
    let learn = match a.estimates.as_str() {
        "learned" => true,
        "none" => false,
        e => bail!("unknown estimates {e:?}: learned or none"),
    };
    if a.protocol == "fgd" {
        let r = sim_fgd(&a.trace, &a.gpus, a.nodes, sched, a.seeds.max(1))?;
        if json {
            print_json(&r)?;
        } else {
            print_fgd(&r);
        }
    } else if a.protocol != "queue" {
        bail!("unknown protocol {:?}: queue or fgd", a.protocol);
    } else if a.seeds > 1 {
        let runs = sim_seeds(
            &a.trace,
            &a.gpus,
            &a.policy,
            a.load,
            a.runtimes,
            sched,
            a.fair_share,
            learn,
            a.seeds,
            a.from_fraction,
            preempt.as_ref(),
            a.lying_users,
            a.preempt_only,
        )?;
        if json {
            print_json(&runs)?;
        } else {
            print_seeds(&runs, a.seeds);
        }
    } else {
        let reports = simulate(
            &a.trace,
            &a.gpus,
            &a.policy,
            a.load,
            a.runtimes,
            sched,
            a.fair_share,
            learn,
            0,
            a.from_fraction,
            preempt.as_ref(),
            a.lying_users,
            a.preempt_only,
        )?;
        if json {
            print_json(&reports)?;
        } else {
            print_sim(&reports);
        }
    }
    Ok(())
}

/// `--preempt` and its settings as the simulator's model.
fn preempt_model(a: &SimArgs) -> Result<gantry_core::sim::SimPreempt> {
    let ms = |d: Duration| d.as_millis() as i64;
    let mut rules = gantry_core::scheduler::PreemptRules {
        overdue: false,
        priority_gap: None,
        fair_share: false,
        min_run_ms: ms(a.min_run),
        max_per_day: a.max_per_day,
    };
    for r in a.preempt_rules.split(',').map(str::trim).filter(|r| !r.is_empty()) {
        match r {
            "overdue" => rules.overdue = true,
            "priority" => rules.priority_gap = Some(a.priority_gap),
            "fair-share" => rules.fair_share = true,
            "none" => {}
            other => bail!("unknown --preempt-rules item {other:?}: overdue, priority, fair-share or none"),
        }
    }
    if !(0.0..=1.0).contains(&a.preemptible) {
        bail!("--preemptible {}: a share from 0 to 1", a.preemptible);
    }
    Ok(gantry_core::sim::SimPreempt {
        rules,
        checkpoint_every_ms: ms(a.checkpoint_every),
        restart_cost_ms: ms(a.restart_cost),
        grace_ms: ms(a.grace),
        preemptible_share: a.preemptible,
        checkpoints_reported: a.checkpoints_reported,
    })
}

#[allow(clippy::too_many_arguments)]
fn simulate(
    trace: &Path,
    gpus: &str,
    policy: &str,
    load: Option<f64>,
    runtimes: bool,
    sched: gantry_core::scheduler::Config,
    fair_share: Option<Duration>,
    learn: bool,
    seed: u64,
    from_fraction: f64,
    preempt: Option<&gantry_core::sim::SimPreempt>,
    lying: f64,
    preempt_only: bool,
) -> Result<Vec<gantry_core::sim::Report>> {
    use gantry_core::sim::{self, Policy, SimConfig};
    let b = gantry_core::gpu::SimulatedBackend::from_spec(gpus)?;
    let (n, mem) = b.shape();
    let mut t = sim::load_trace(trace, n)?;
    let skip = (t.jobs.len() as f64 * from_fraction.clamp(0.0, 1.0)) as usize;
    t.jobs.drain(..skip);
    sim::perturb_arrivals(&mut t.jobs, seed);
    if let Some(l) = load {
        sim::rescale_load(&mut t.jobs, n, l);
    }
    let policies: Vec<Policy> = if policy == "all" {
        Policy::ALL.to_vec()
    } else {
        vec![Policy::parse(policy)
            .with_context(|| format!("unknown policy {policy:?}: serial, fifo, greedy, gantry or all"))?]
    };
    let mut out = vec![];
    for p in policies {
        let mut cfg = SimConfig {
            gpus: n,
            gpu_memory: mem,
            policy: p,
            declared_runtimes: false,
            scheduler: sched.clone(),
            fair_share_half_life_s: fair_share.map(|d| d.as_secs_f64()),
            learn_runtimes: learn,
            preempt: None,
            lying: None,
        };
        if !(preempt_only && preempt.is_some() && p == Policy::Gantry) {
            out.push(sim::simulate(&t, &cfg));
        }
        if p == Policy::Gantry && preempt.is_some() {
            out.push(sim::simulate(
                &t,
                &SimConfig {
                    preempt: preempt.cloned(),
                    ..cfg.clone()
                },
            ));
        }
        if p == Policy::Gantry && (runtimes || policy == "all") {
            cfg.declared_runtimes = true;
            out.push(sim::simulate(&t, &cfg));
            if preempt.is_some() {
                out.push(sim::simulate(
                    &t,
                    &SimConfig {
                        preempt: preempt.cloned(),
                        ..cfg.clone()
                    },
                ));
            }
            // Some users lie: declarations trusted (before issue 18 item 7), then checked.
            if lying > 0.0 {
                for checked in [false, true] {
                    let lying = Some(sim::SimLying { share: lying, checked });
                    out.push(sim::simulate(
                        &t,
                        &SimConfig {
                            lying: lying.clone(),
                            ..cfg.clone()
                        },
                    ));
                    if preempt.is_some() {
                        out.push(sim::simulate(
                            &t,
                            &SimConfig {
                                preempt: preempt.cloned(),
                                lying,
                                ..cfg.clone()
                            },
                        ));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// One row of `gantry sim --seeds`: a policy's figures over the seeds.
#[derive(serde::Serialize)]
struct SeedRow {
    policy: String,
    makespan_ratio: Vec<f64>,
    alloc_share_while_waiting: Vec<f64>,
    /// Mean wait over fifo's mean wait on the same seed.
    wait_over_fifo: Vec<f64>,
    big_over_one: Vec<f64>,
    /// Per-user mean wait (s), per seed.
    mean_wait_by_user: Vec<std::collections::BTreeMap<String, f64>>,
    /// GPU-hours lost to preemption over the trace's GPU-hours, per seed.
    lost_share: Vec<f64>,
    preemptions: Vec<f64>,
}

#[allow(clippy::too_many_arguments)]
fn sim_seeds(
    trace: &Path,
    gpus: &str,
    policy: &str,
    load: Option<f64>,
    runtimes: bool,
    sched: gantry_core::scheduler::Config,
    fair_share: Option<Duration>,
    learn: bool,
    seeds: u64,
    from_fraction: f64,
    preempt: Option<&gantry_core::sim::SimPreempt>,
    lying: f64,
    preempt_only: bool,
) -> Result<Vec<SeedRow>> {
    // Seeds are independent runs: one thread per core takes the next seed; the rows are built in
    // seed order afterwards, so the output does not depend on the threads.
    // One seed's reports, and fifo's mean wait on its arrivals.
    type Seed = Result<(Vec<gantry_core::sim::Report>, f64)>;
    let one = |seed: u64| -> Seed {
        let reports = simulate(
            trace,
            gpus,
            policy,
            load,
            runtimes,
            sched.clone(),
            fair_share,
            learn,
            seed,
            from_fraction,
            preempt,
            lying,
            preempt_only,
        )?;
        // Waits are reported relative to strict FIFO on the same arrivals.
        let fifo = match reports.iter().find(|r| r.policy == "fifo") {
            Some(f) => f.mean_wait_s,
            None => {
                simulate(
                    trace,
                    gpus,
                    "fifo",
                    load,
                    false,
                    sched.clone(),
                    fair_share,
                    learn,
                    seed,
                    from_fraction,
                    None,
                    0.0,
                    false,
                )?[0]
                    .mean_wait_s
            }
        };
        Ok((reports, fifo))
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(seeds as usize)
        .max(1);
    let next = std::sync::atomic::AtomicU64::new(0);
    let done: std::sync::Mutex<Vec<(u64, Seed)>> = Default::default();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let seed = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if seed >= seeds {
                    break;
                }
                let r = one(seed);
                done.lock().expect("a seed's thread panicked").push((seed, r));
            });
        }
    });
    let mut done = done.into_inner().expect("a seed's thread panicked");
    done.sort_by_key(|(seed, _)| *seed);
    let mut rows: Vec<SeedRow> = vec![];
    for (_, r) in done {
        let (mut reports, fifo) = r?;
        for r in reports.drain(..) {
            let row = match rows.iter_mut().position(|x| x.policy == r.policy) {
                Some(i) => &mut rows[i],
                None => {
                    rows.push(SeedRow {
                        policy: r.policy.clone(),
                        makespan_ratio: vec![],
                        alloc_share_while_waiting: vec![],
                        wait_over_fifo: vec![],
                        big_over_one: vec![],
                        mean_wait_by_user: vec![],
                        lost_share: vec![],
                        preemptions: vec![],
                    });
                    rows.last_mut().unwrap()
                }
            };
            row.makespan_ratio.push(r.makespan_ratio);
            row.alloc_share_while_waiting.push(r.alloc_share_while_waiting);
            row.wait_over_fifo
                .push(if fifo > 0.0 { r.mean_wait_s / fifo } else { f64::NAN });
            if let Some(b) = r.big_over_one() {
                row.big_over_one.push(b);
            }
            row.mean_wait_by_user.push(r.mean_wait_by_user.clone());
            row.lost_share.push(r.lost_share);
            row.preemptions.push(r.preemptions as f64);
        }
    }
    Ok(rows)
}

fn print_seeds(rows: &[SeedRow], seeds: u64) {
    use gantry_core::sim::mean_ci;
    outln!("{seeds} seeds (arrival perturbations; seed 0 = as recorded); mean ± 95% CI");
    let pre = rows.iter().any(|r| r.policy.contains("+preempt"));
    outln!(
        "{:<26} {:>16} {:>16} {:>16} {:>16}{}",
        "policy",
        "makespan/LB",
        "alloc/wait %",
        "wait/fifo",
        "wait 4+/1 GPU",
        if pre {
            format!(" {:>16} {:>14}", "GPU-h lost %", "preemptions")
        } else {
            String::new()
        }
    );
    let f = |xs: &[f64], scale: f64, digits: usize| {
        if xs.is_empty() {
            "-".to_string()
        } else {
            let (m, c) = mean_ci(xs);
            format!("{:.d$} ± {:.d$}", m * scale, c * scale, d = digits)
        }
    };
    for r in rows {
        outln!(
            "{:<26} {:>16} {:>16} {:>16} {:>16}{}",
            r.policy,
            f(&r.makespan_ratio, 1.0, 3),
            f(&r.alloc_share_while_waiting, 100.0, 1),
            f(&r.wait_over_fifo, 1.0, 3),
            f(&r.big_over_one, 1.0, 2),
            if pre {
                format!(" {:>16} {:>14}", f(&r.lost_share, 100.0, 2), f(&r.preemptions, 1.0, 0))
            } else {
                String::new()
            }
        );
    }
    // Issue 32: with preemption on, is the allocated share ever lower, or a user's wait more than 10% longer?
    for r in rows.iter().filter(|r| r.policy.ends_with("+preempt")) {
        let Some(base) = rows.iter().find(|b| b.policy == r.policy.trim_end_matches("+preempt")) else {
            continue;
        };
        let lower = r
            .alloc_share_while_waiting
            .iter()
            .zip(&base.alloc_share_while_waiting)
            .filter(|(p, b)| p < b)
            .count();
        let longer = r
            .makespan_ratio
            .iter()
            .zip(&base.makespan_ratio)
            .filter(|(p, b)| p > b)
            .count();
        let mean_of = |ms: &[std::collections::BTreeMap<String, f64>], u: &str| {
            let xs: Vec<f64> = ms.iter().filter_map(|m| m.get(u).copied()).collect();
            xs.iter().sum::<f64>() / xs.len().max(1) as f64
        };
        let users: std::collections::BTreeSet<&String> = base.mean_wait_by_user.iter().flat_map(|m| m.keys()).collect();
        let worse: Vec<String> = users
            .iter()
            .map(|u| {
                let (b, p) = (mean_of(&base.mean_wait_by_user, u), mean_of(&r.mean_wait_by_user, u));
                format!("{} {:+.1}%", esc(u), if b > 0.0 { 100.0 * (p / b - 1.0) } else { 0.0 })
            })
            .collect();
        outln!(
            "{:<26} vs {}: alloc/wait lower on {lower} of {n} seeds, makespan longer on {longer} of {n}; mean wait by user {}",
            r.policy,
            base.policy,
            if worse.is_empty() { "-".to_string() } else { worse.join(", ") },
            n = r.alloc_share_while_waiting.len(),
        );
    }
    let h = |s: f64| duration_brief_ms((s * 1000.0) as i64);
    for r in rows {
        let users: std::collections::BTreeSet<&String> = r.mean_wait_by_user.iter().flat_map(|m| m.keys()).collect();
        if users.len() > 1 {
            let w: Vec<String> = users
                .iter()
                .map(|u| {
                    let xs: Vec<f64> = r.mean_wait_by_user.iter().filter_map(|m| m.get(*u).copied()).collect();
                    let (m, c) = mean_ci(&xs);
                    format!("{} {} ± {}", esc(u), h(m), h(c))
                })
                .collect();
            outln!("{:<26} mean wait: {}", r.policy, w.join(", "));
        }
    }
}

fn sim_fgd(
    trace: &Path,
    gpus: &str,
    nodes: u32,
    sched: gantry_core::scheduler::Config,
    seeds: u64,
) -> Result<Vec<gantry_core::sim::FgdReport>> {
    let b = gantry_core::gpu::SimulatedBackend::from_spec(gpus)?;
    let (n, mem) = b.shape();
    let t = gantry_core::sim::load_trace(trace, n)?;
    let mut out = vec![];
    for packing in [
        gantry_core::scheduler::Packing::Fgd,
        gantry_core::scheduler::Packing::BestFit,
        gantry_core::scheduler::Packing::WorstFit,
    ] {
        let cfg = gantry_core::scheduler::Config {
            packing,
            ..sched.clone()
        };
        out.push(gantry_core::sim::simulate_fgd(&t, n, mem, nodes, &cfg, seeds, 1.3));
    }
    Ok(out)
}

fn print_fgd(rs: &[gantry_core::sim::FgdReport]) {
    use gantry_core::sim::mean_ci;
    let Some(r0) = rs.first() else { return };
    outln!(
        "FGD protocol: {} machine(s) of {} GPUs, tasks in shuffled order, arrivals only, a task that does not fit fails; stop at {:.0}% of the GPU capacity requested; {} seeds, mean ± 95% CI",
        r0.nodes, r0.gpus_per_node, r0.stop_at * 100.0, r0.alloc_ratio.len()
    );
    outln!(
        "{:<12} {:>22} {:>16}",
        "packing",
        "GPU allocation ratio %",
        "failed tasks"
    );
    for r in rs {
        let (m, c) = mean_ci(&r.alloc_ratio);
        let (fm, fc) = mean_ci(&r.failed);
        outln!(
            "{:<12} {:>22} {:>16}",
            r.packing,
            format!("{:.1} ± {:.1}", m * 100.0, c * 100.0),
            format!("{fm:.1} ± {fc:.1}")
        );
    }
}

fn print_sim(reports: &[gantry_core::sim::Report]) {
    let Some(r0) = reports.first() else { return };
    outln!(
        "{} jobs on {} GPUs ({} CPU-only and {} too-large tasks dropped)",
        r0.jobs,
        r0.gpus,
        r0.dropped_cpu_only,
        r0.dropped_too_big
    );
    let pre = reports.iter().any(|r| r.policy.contains("+preempt"));
    outln!(
        "{:<26} {:>12} {:>9} {:>11} {:>12} {:>12} {:>14}{}",
        "policy",
        "makespan",
        "xLB",
        "alloc/wait",
        "mean wait",
        "p95 wait",
        "wait 4+/1 GPU",
        if pre {
            format!(" {:>12} {:>12} {:>14}", "GPU-h lost", "preemptions", "GPU-h/preempt")
        } else {
            String::new()
        }
    );
    let h = |s: f64| duration_brief_ms((s * 1000.0) as i64);
    for r in reports {
        let w1 = r.mean_wait_by_gpus.get(&1).copied().unwrap_or(0.0);
        let big: Vec<f64> = r
            .mean_wait_by_gpus
            .iter()
            .filter(|(g, _)| **g >= 4)
            .map(|(_, w)| *w)
            .collect();
        let ratio = if big.is_empty() || w1 == 0.0 {
            "-".to_string()
        } else {
            format!("{:.2}", big.iter().sum::<f64>() / big.len() as f64 / w1)
        };
        let lost = if pre {
            let each = if r.preemptions == 0 {
                "-".to_string()
            } else {
                format!("{:.3}", r.gpu_hours_lost / r.preemptions as f64)
            };
            format!(" {:>11.2}% {:>12} {:>14}", 100.0 * r.lost_share, r.preemptions, each)
        } else {
            String::new()
        };
        outln!(
            "{:<26} {:>12} {:>9.3} {:>10.1}% {:>12} {:>12} {:>14}{lost}",
            r.policy,
            h(r.makespan_s),
            r.makespan_ratio,
            100.0 * r.alloc_share_while_waiting,
            h(r.mean_wait_s),
            h(r.p95_wait_s),
            ratio
        );
    }
    outln!("lower bound: {}", h(r0.lower_bound_s));
    for r in reports.iter().filter(|r| r.preemptions > 0) {
        let m = &r.mechanisms;
        outln!(
            "{:<26} preemption: claimed GPUs idle {:.1} GPU-h; victims the job did not start on {}; \
             whole-GPU victims of shared jobs {}; own-user victims {}; wider victims {}; GPUs given up at \
             the swap {:.1}; decision to start {:.1} h; re-waits {:.1} GPU-h; jobs preempted 2+ times {}",
            r.policy,
            m.claim_idle_gpu_h,
            m.victims_unused,
            m.shared_over_exclusive,
            m.own_user,
            m.wider,
            m.alloc_given_up_gpus,
            m.decision_to_start_h,
            m.rewait_gpu_h,
            m.preempted_twice
        );
    }
    if r0.user_share.len() > 1 {
        for r in reports {
            let shares: Vec<String> = r
                .user_share
                .iter()
                .map(|(u, s)| format!("{} {:.1}%", esc(u), s * 100.0))
                .collect();
            let waits: Vec<String> = r
                .mean_wait_by_user
                .iter()
                .map(|(u, w)| format!("{} {}", esc(u), h(*w)))
                .collect();
            outln!(
                "{:<26} GPU share under contention: {}; mean wait: {}",
                r.policy,
                shares.join(", "),
                waits.join(", ")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--seeds` runs seeds on several threads: each seed's figures are the ones a run of that seed
    /// alone gives, in seed order, so the printed table does not depend on the threads.
    #[test]
    fn seeds_on_threads_give_each_seeds_own_figures_in_order() {
        let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/lab-week.csv");
        let sched = gantry_core::scheduler::Config::default();
        let rows = sim_seeds(
            &trace,
            "4x24GiB",
            "gantry",
            None,
            false,
            sched.clone(),
            None,
            true,
            4,
            0.0,
            None,
            0.0,
            false,
        )
        .unwrap();
        let gantry = rows.iter().find(|r| r.policy == "gantry").unwrap();
        assert_eq!(gantry.makespan_ratio.len(), 4);
        let alone: Vec<f64> = (0..4)
            .map(|seed| {
                simulate(
                    &trace,
                    "4x24GiB",
                    "gantry",
                    None,
                    false,
                    sched.clone(),
                    None,
                    true,
                    seed,
                    0.0,
                    None,
                    0.0,
                    false,
                )
                .unwrap()[0]
                    .makespan_ratio
            })
            .collect();
        assert_eq!(gantry.makespan_ratio, alone);
        assert!(
            alone.windows(2).any(|w| w[0] != w[1]),
            "seeds perturb arrivals: {alone:?}"
        );
    }
}
