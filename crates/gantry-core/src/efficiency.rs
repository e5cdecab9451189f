//! How well a run used what it held (issue 30 item 3), pure: an attempt's measures as the engine
//! gathers them, a run's [`Efficiency`] over its attempts with advice its owner can act on, and the
//! per user and per day report of `gantry usage --efficiency`. The measuring is `engine::efficiency`,
//! the rows `store::efficiency`.

use std::collections::BTreeMap;

use crate::defaults::{
    CPU_ADVICE_MIN_MILLI, CPU_BOUND, CPU_USED_LOW, EFFICIENCY_ADVICE_AFTER_MS, GPU_MEMORY_SHARE_MAX,
    GPU_MEMORY_USED_LOW, GPU_UTIL_LOW, MEMORY_ADVICE_HEADROOM, RAM_ADVICE_MIN, RAM_USED_LOW,
};
use crate::protocol::{DayEfficiency, Efficiency, EfficiencyReport, UserEfficiency};
use crate::units::{format_bytes, format_cpus};

/// One attempt's measures, as sampled while it ran (one row of `attempt_efficiency`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AttemptUse {
    pub attempt_id: i64,
    pub job_id: i64,
    /// CPUs held (its limit), thousandths.
    pub cpus_milli: u64,
    /// Its RAM limit (bytes).
    pub ram_held: Option<u64>,
    /// Its container's CPU time at the last sample (ns) ...
    pub cpu_ns: Option<u64>,
    /// ... and the time from its start to that sample (ms).
    pub cpu_wall_ms: Option<i64>,
    pub ram_peak: Option<u64>,
    pub gpus: u32,
    /// Sum over samples of the mean utilization of its GPUs (each 0..1).
    pub gpu_util_sum: f64,
    pub gpu_samples: u64,
    /// Samples in which one of its GPUs ran another job of this engine too.
    pub gpu_shared: u64,
    pub gpu_memory_peak: Option<u64>,
    pub gpu_memory_simulated: bool,
    pub gpu_memory_total: Option<u64>,
}

impl AttemptUse {
    /// Mean utilization of its GPUs over its samples (0..1).
    pub fn gpu_util(&self) -> Option<f64> {
        (self.gpu_samples > 0).then(|| self.gpu_util_sum / self.gpu_samples as f64)
    }

    /// CPU efficiency (0..1): CPU time ÷ (CPUs held × time measured).
    pub fn cpu(&self) -> Option<f64> {
        let (ns, ms) = (self.cpu_ns?, self.cpu_wall_ms?);
        (ms > 0 && self.cpus_milli > 0)
            .then(|| (ns as f64 / 1e6 / ms as f64 / (self.cpus_milli as f64 / 1000.0)).min(1.0))
    }
}

/// A run's efficiency over its attempts: CPU time and time measured add up, peaks are the largest,
/// GPU utilization is the mean of every sample. `declared_gpu_memory`: its `gpu_memory` (per GPU).
pub fn summarize(uses: &[AttemptUse], declared_gpu_memory: Option<u64>) -> Option<Efficiency> {
    let last = uses.last()?;
    let mut cpu_ns = 0u64;
    let mut cpu_ms = 0i64;
    let mut cpu_known = false;
    for u in uses {
        if let (Some(ns), Some(ms)) = (u.cpu_ns, u.cpu_wall_ms) {
            // Weighed by the CPUs each attempt held: CPU-seconds over CPU-seconds held.
            cpu_ns = cpu_ns.saturating_add(ns);
            cpu_ms += ms * u.cpus_milli as i64 / 1000;
            cpu_known = true;
        }
    }
    let measured_ms: i64 = uses.iter().filter_map(|u| u.cpu_wall_ms).sum();
    let cpus_held = last.cpus_milli as f64 / 1000.0;
    let cpu = (cpu_known && cpu_ms > 0).then(|| (cpu_ns as f64 / 1e6 / cpu_ms as f64).min(1.0));
    let samples: u64 = uses.iter().map(|u| u.gpu_samples).sum();
    let gpu_util = (samples > 0).then(|| uses.iter().map(|u| u.gpu_util_sum).sum::<f64>() / samples as f64);
    let mut e = Efficiency {
        cpu,
        cpus_held,
        cpus_used: cpu.map(|c| c * cpus_held),
        ram_peak: uses.iter().filter_map(|u| u.ram_peak).max(),
        ram_held: last.ram_held,
        gpu_util,
        gpu_shared: uses.iter().any(|u| u.gpu_shared > 0),
        gpu_memory_peak: uses.iter().filter_map(|u| u.gpu_memory_peak).max(),
        gpu_memory_simulated: uses.iter().any(|u| u.gpu_memory_simulated),
        gpu_memory_total: uses.iter().filter_map(|u| u.gpu_memory_total).max(),
        measured_ms,
        advice: vec![],
    };
    e.advice = advice(&e, declared_gpu_memory);
    Some(e)
}

/// `6.1 GiB` peak -> `7GiB`: the peak and its headroom, rounded up to a GiB, as a spec writes it.
fn suggest_gib(peak: u64) -> String {
    let gib = (peak as f64 * (1.0 + MEMORY_ADVICE_HEADROOM) / (1u64 << 30) as f64)
        .ceil()
        .max(1.0);
    format!("{gib}GiB")
}

fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

/// What its owner can do, one sentence each, from what was measured (nothing for a run measured
/// less than [`EFFICIENCY_ADVICE_AFTER_MS`]).
pub fn advice(e: &Efficiency, declared_gpu_memory: Option<u64>) -> Vec<String> {
    let mut out = vec![];
    if e.measured_ms < EFFICIENCY_ADVICE_AFTER_MS {
        return out;
    }
    // GPU memory: a real measure only (a simulated GPU's figure is the declaration itself).
    if let (Some(peak), false) = (e.gpu_memory_peak, e.gpu_memory_simulated) {
        match (declared_gpu_memory, e.gpu_memory_total) {
            (None, Some(total)) if (peak as f64) <= total as f64 * GPU_MEMORY_SHARE_MAX => out.push(format!(
                "used at most {} of GPU memory: declare `gpu_memory: {}` and it can share a card",
                format_bytes(peak),
                suggest_gib(peak)
            )),
            (Some(declared), _) if (peak as f64) < declared as f64 * GPU_MEMORY_USED_LOW => out.push(format!(
                "used at most {} of the {} of GPU memory it declared: declare `gpu_memory: {}` and more jobs fit beside it",
                format_bytes(peak),
                format_bytes(declared),
                suggest_gib(peak)
            )),
            _ => {}
        }
    }
    if let Some(util) = e.gpu_util.filter(|u| *u < GPU_UTIL_LOW) {
        let shared = if e.gpu_shared {
            " (its GPU ran other jobs too: the figure is the GPU's, not this run's alone)"
        } else {
            ""
        };
        match e.cpu.filter(|c| *c >= CPU_BOUND) {
            Some(c) => out.push(format!(
                "GPU busy {} of the time while its {} CPUs were {} busy: it is CPU-bound, ask for more `cpus`{shared}",
                pct(util),
                format_cpus((e.cpus_held * 1000.0).round() as u64),
                pct(c)
            )),
            None => out.push(format!(
                "GPU busy {} of the time: the input pipeline may be the bottleneck (more data-loader workers, data on a local disk){shared}",
                pct(util)
            )),
        }
    }
    let held_milli = (e.cpus_held * 1000.0).round() as u64;
    if let (Some(c), Some(used)) = (e.cpu, e.cpus_used) {
        if c < CPU_USED_LOW && held_milli >= CPU_ADVICE_MIN_MILLI {
            let want = (used * (1.0 + MEMORY_ADVICE_HEADROOM)).ceil().max(1.0);
            out.push(format!(
                "held {} CPUs, used {used:.1}: declare `cpus: {want}` and the rest can run other jobs",
                format_cpus(held_milli)
            ));
        }
    }
    if let (Some(peak), Some(held)) = (e.ram_peak, e.ram_held) {
        if held >= RAM_ADVICE_MIN && (peak as f64) < held as f64 * RAM_USED_LOW {
            out.push(format!(
                "used at most {} of the {} of RAM it held: declare `memory: {}`",
                format_bytes(peak),
                format_bytes(held),
                suggest_gib(peak)
            ));
        }
    }
    out
}

/// One attempt for the usage report: its owner, when it ran, what it held and its measures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageAttempt {
    pub user: String,
    pub start: i64,
    /// `None`: still running (counted up to the report's end).
    pub end: Option<i64>,
    pub gpus: u32,
    pub gpu_util: Option<f64>,
    pub cpu: Option<f64>,
    pub cpus_milli: u64,
}

const DAY_MS: i64 = 86_400_000;

/// `gantry usage --efficiency` over [since, until): per user, GPU-hours held and used (weighted by
/// each attempt's mean GPU utilization) and mean CPU efficiency (weighted by CPUs × time); per local
/// day (`tz_offset_min` east of UTC), the machine's held and used GPU-hours.
pub fn report(attempts: &[UsageAttempt], since: i64, until: i64, tz_offset_min: i32) -> EfficiencyReport {
    let tz = tz_offset_min as i64 * 60_000;
    let mut users: BTreeMap<&str, (UserEfficiency, f64, f64)> = BTreeMap::new();
    let mut days: BTreeMap<i64, DayEfficiency> = BTreeMap::new();
    for a in attempts {
        let (s, t) = (a.start.max(since), a.end.unwrap_or(until).min(until));
        if t <= s {
            continue;
        }
        let hours = (t - s) as f64 / 3_600_000.0;
        let held = hours * a.gpus as f64;
        let (u, cpu_w, cpu_sum) = users.entry(&a.user).or_insert_with(|| {
            (
                UserEfficiency {
                    user: a.user.clone(),
                    gpu_hours_held: 0.0,
                    gpu_hours_used: 0.0,
                    gpu_hours_unmeasured: 0.0,
                    cpu: None,
                    runs: 0,
                },
                0.0,
                0.0,
            )
        });
        u.runs += 1;
        u.gpu_hours_held += held;
        match a.gpu_util {
            Some(g) => u.gpu_hours_used += held * g,
            None => u.gpu_hours_unmeasured += held,
        }
        if let Some(c) = a.cpu {
            let w = hours * a.cpus_milli as f64 / 1000.0;
            *cpu_w += w;
            *cpu_sum += c * w;
        }
        if a.gpus == 0 {
            continue;
        }
        // Split across local days.
        let mut from = s;
        while from < t {
            let day = (from + tz).div_euclid(DAY_MS) * DAY_MS - tz;
            let to = (day + DAY_MS).min(t);
            let h = (to - from) as f64 / 3_600_000.0 * a.gpus as f64;
            let d = days.entry(day).or_insert(DayEfficiency {
                start: day,
                gpu_hours_held: 0.0,
                gpu_hours_used: 0.0,
            });
            d.gpu_hours_held += h;
            d.gpu_hours_used += h * a.gpu_util.unwrap_or(0.0);
            from = to;
        }
    }
    let mut users: Vec<UserEfficiency> = users
        .into_values()
        .map(|(mut u, w, sum)| {
            u.cpu = (w > 0.0).then(|| sum / w);
            u
        })
        .collect();
    users.sort_by(|a, b| b.gpu_hours_held.total_cmp(&a.gpu_hours_held).then(a.user.cmp(&b.user)));
    EfficiencyReport {
        since_ms: since,
        until_ms: until,
        users,
        days: days.into_values().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    fn eff() -> Efficiency {
        Efficiency {
            cpu: Some(0.7),
            cpus_held: 4.0,
            cpus_used: Some(2.8),
            ram_peak: Some(6 * G),
            ram_held: Some(8 * G),
            gpu_util: Some(0.85),
            gpu_shared: false,
            gpu_memory_peak: Some(60 * G),
            gpu_memory_simulated: false,
            gpu_memory_total: Some(80 * G),
            measured_ms: 3_600_000,
            advice: vec![],
        }
    }

    /// Issue 30 item 3: the advice a researcher reads under `gantry show` and on the run page.
    #[test]
    fn advice_says_what_to_change_and_nothing_for_a_run_that_used_what_it_held() {
        let cases: Vec<(&str, Efficiency, Option<u64>, Vec<&str>)> = vec![
            ("a run that used what it held: nothing to say", eff(), None, vec![]),
            (
                "a whole 80 GiB card, 6.1 GiB used: it could share",
                Efficiency {
                    gpu_memory_peak: Some((6.1 * G as f64) as u64),
                    ..eff()
                },
                None,
                vec!["used at most 6.1 GiB of GPU memory: declare `gpu_memory: 7GiB` and it can share a card"],
            ),
            (
                "declared 16 GiB, used 3.1",
                Efficiency {
                    gpu_memory_peak: Some((3.1 * G as f64) as u64),
                    ..eff()
                },
                Some(16 * G),
                vec!["used at most 3.1 GiB of the 16.0 GiB of GPU memory it declared: declare `gpu_memory: 4GiB` and more jobs fit beside it"],
            ),
            (
                "a simulated GPU's memory is its declaration: no advice from it",
                Efficiency {
                    gpu_memory_peak: Some(2 * G),
                    gpu_memory_simulated: true,
                    ..eff()
                },
                Some(16 * G),
                vec![],
            ),
            (
                "GPU mostly idle, CPUs not saturated: the input pipeline",
                Efficiency {
                    gpu_util: Some(0.12),
                    ..eff()
                },
                None,
                vec!["GPU busy 12% of the time: the input pipeline may be the bottleneck (more data-loader workers, data on a local disk)"],
            ),
            (
                "GPU mostly idle and shared with other jobs",
                Efficiency {
                    gpu_util: Some(0.12),
                    gpu_shared: true,
                    ..eff()
                },
                None,
                vec!["GPU busy 12% of the time: the input pipeline may be the bottleneck (more data-loader workers, data on a local disk) (its GPU ran other jobs too: the figure is the GPU's, not this run's alone)"],
            ),
            (
                "GPU mostly idle, every CPU busy: CPU-bound",
                Efficiency {
                    gpu_util: Some(0.2),
                    cpu: Some(0.95),
                    cpus_used: Some(3.8),
                    ..eff()
                },
                None,
                vec!["GPU busy 20% of the time while its 4 CPUs were 95% busy: it is CPU-bound, ask for more `cpus`"],
            ),
            (
                "held 8 CPUs, used 1.3",
                Efficiency {
                    cpu: Some(1.3 / 8.0),
                    cpus_held: 8.0,
                    cpus_used: Some(1.3),
                    ..eff()
                },
                None,
                vec!["held 8 CPUs, used 1.3: declare `cpus: 2` and the rest can run other jobs"],
            ),
            (
                "one CPU held and idle: not worth a sentence",
                Efficiency {
                    cpu: Some(0.01),
                    cpus_held: 1.0,
                    cpus_used: Some(0.01),
                    ..eff()
                },
                None,
                vec![],
            ),
            (
                "32 GiB of RAM held, 1.2 used",
                Efficiency {
                    ram_peak: Some((1.2 * G as f64) as u64),
                    ram_held: Some(32 * G),
                    ..eff()
                },
                None,
                vec!["used at most 1.2 GiB of the 32.0 GiB of RAM it held: declare `memory: 2GiB`"],
            ),
            (
                "measured under a minute: a framework's start says nothing yet",
                Efficiency {
                    gpu_util: Some(0.0),
                    cpu: Some(0.01),
                    cpus_held: 8.0,
                    cpus_used: Some(0.08),
                    measured_ms: 59_000,
                    ..eff()
                },
                None,
                vec![],
            ),
        ];
        for (name, e, declared, want) in cases {
            assert_eq!(advice(&e, declared), want, "{name}");
        }
    }

    #[test]
    fn a_runs_efficiency_adds_its_attempts_up() {
        let a = AttemptUse {
            cpus_milli: 2000,
            cpu_ns: Some(60_000_000_000), // 60 CPU-s over 60 s on 2 CPUs: 0.5
            cpu_wall_ms: Some(60_000),
            ram_peak: Some(G),
            gpus: 1,
            gpu_util_sum: 10.0 * 0.9,
            gpu_samples: 10,
            gpu_memory_peak: Some(3 * G),
            ..Default::default()
        };
        let b = AttemptUse {
            cpu_ns: Some(120_000_000_000), // 120 CPU-s over 60 s on 2 CPUs: 1.0
            gpu_util_sum: 30.0 * 0.1,
            gpu_samples: 30,
            gpu_shared: 1,
            ram_peak: Some(2 * G),
            gpu_memory_peak: Some(G),
            ..a.clone()
        };
        let e = summarize(&[a, b], None).unwrap();
        assert_eq!(e.cpu, Some(0.75));
        assert_eq!(e.cpus_used, Some(1.5));
        assert_eq!(e.ram_peak, Some(2 * G));
        assert_eq!(e.gpu_memory_peak, Some(3 * G));
        assert!((e.gpu_util.unwrap() - 0.3).abs() < 1e-9, "{e:?}");
        assert!(e.gpu_shared);
        assert_eq!(e.measured_ms, 120_000);
        assert_eq!(summarize(&[], None), None);
    }

    #[test]
    fn the_usage_report_weighs_held_gpu_hours_by_utilization_per_user_and_per_day() {
        let h = 3_600_000;
        let day = 24 * h;
        let attempts = vec![
            // alice: 2 GPUs for 2 h across midnight at 50 %
            UsageAttempt {
                user: "alice".into(),
                start: day - h,
                end: Some(day + h),
                gpus: 2,
                gpu_util: Some(0.5),
                cpu: Some(0.2),
                cpus_milli: 4000,
            },
            // bob: 1 GPU for 1 h, unmeasured (Slurm)
            UsageAttempt {
                user: "bob".into(),
                start: day + 2 * h,
                end: Some(day + 3 * h),
                gpus: 1,
                gpu_util: None,
                cpu: None,
                cpus_milli: 1000,
            },
        ];
        let r = report(&attempts, 0, 2 * day, 0);
        assert_eq!(r.users[0].user, "alice");
        assert_eq!(r.users[0].gpu_hours_held, 4.0);
        assert_eq!(r.users[0].gpu_hours_used, 2.0);
        assert_eq!(r.users[0].cpu, Some(0.2));
        assert_eq!(r.users[1].gpu_hours_unmeasured, 1.0);
        assert_eq!(r.users[1].cpu, None);
        let days: Vec<(i64, f64, f64)> = r
            .days
            .iter()
            .map(|d| (d.start, d.gpu_hours_held, d.gpu_hours_used))
            .collect();
        assert_eq!(days, vec![(0, 2.0, 1.0), (day, 3.0, 1.0)]);
        // Clipped to the window.
        let r = report(&attempts, day, 2 * day, 0);
        assert_eq!(r.users[0].gpu_hours_held, 2.0);
    }
}
