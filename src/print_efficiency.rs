//! `gantry show`'s efficiency lines and `gantry usage --efficiency` (issue 30 item 3).

use gantry_core::protocol::{Efficiency, EfficiencyReport};
use gantry_core::units::{duration_brief_ms, format_bytes, format_cpus};

use crate::term::{esc, outln};

/// A 0..1 share as a percentage.
fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

/// The efficiency block of `gantry show`: each measured figure, then the advice.
pub fn print_efficiency(e: &Efficiency) {
    outln!("efficiency (measured over {}):", duration_brief_ms(e.measured_ms));
    let held = format_cpus((e.cpus_held * 1000.0).round() as u64);
    match (e.cpu, e.cpus_used) {
        (Some(c), Some(u)) => outln!("  CPU:        {} ({u:.2} of {held} CPUs held)", pct(c)),
        _ => outln!("  CPU:        not measured ({held} CPUs held)"),
    }
    match (e.ram_peak, e.ram_held) {
        (Some(p), Some(h)) => outln!("  RAM:        peak {} of {} held", format_bytes(p), format_bytes(h)),
        (Some(p), None) => outln!("  RAM:        peak {}", format_bytes(p)),
        _ => outln!("  RAM:        not measured"),
    }
    if let Some(u) = e.gpu_util {
        let shared = if e.gpu_shared {
            " (its GPU ran other jobs too: the GPU's figure, not this run's alone)"
        } else {
            ""
        };
        outln!("  GPU busy:   {} of the time{shared}", pct(u));
    }
    if let Some(m) = e.gpu_memory_peak {
        let of = e
            .gpu_memory_total
            .map(|t| format!(" of {} on one GPU", format_bytes(t)))
            .unwrap_or_default();
        let sim = if e.gpu_memory_simulated {
            " (simulated GPU: its declared memory)"
        } else {
            ""
        };
        outln!("  GPU memory: peak {}{of}{sim}", format_bytes(m));
    }
    for a in &e.advice {
        outln!("  advice:     {}", esc(a));
    }
}

/// `gantry usage --efficiency`: per user, then per day.
pub fn print_usage_efficiency(r: &EfficiencyReport) {
    if r.users.is_empty() {
        outln!("no use in this window");
        return;
    }
    let held: f64 = r.users.iter().map(|u| u.gpu_hours_held).sum();
    let used: f64 = r.users.iter().map(|u| u.gpu_hours_used).sum();
    let unmeasured: f64 = r.users.iter().map(|u| u.gpu_hours_unmeasured).sum();
    outln!(
        "{:<16} {:>6} {:>10} {:>10} {:>6} {:>9}",
        "USER",
        "RUNS",
        "GPU-H HELD",
        "GPU-H USED",
        "USED",
        "CPU EFF"
    );
    let share = |used: f64, held: f64| {
        if held > 0.0 {
            pct(used / held)
        } else {
            "-".into()
        }
    };
    for u in &r.users {
        outln!(
            "{:<16} {:>6} {:>10.2} {:>10.2} {:>6} {:>9}",
            crate::print::trunc(&esc(&u.user), 16),
            u.runs,
            u.gpu_hours_held,
            u.gpu_hours_used,
            share(u.gpu_hours_used, u.gpu_hours_held - u.gpu_hours_unmeasured),
            u.cpu.map(pct).unwrap_or_else(|| "-".into())
        );
    }
    outln!(
        "{:<16} {:>6} {:>10.2} {:>10.2} {:>6}",
        "all",
        r.users.iter().map(|u| u.runs).sum::<u64>(),
        held,
        used,
        share(used, held - unmeasured)
    );
    if unmeasured > 0.0 {
        outln!(
            "{unmeasured:.2} GPU-hours held were not measured (the Slurm backend, or runs shorter than a sample): USED leaves them out"
        );
    }
    if r.days.is_empty() {
        return;
    }
    outln!("");
    outln!(
        "{:<12} {:>10} {:>10} {:>6}",
        "DAY (UTC)",
        "GPU-H HELD",
        "GPU-H USED",
        "USED"
    );
    for d in &r.days {
        outln!(
            "{:<12} {:>10.2} {:>10.2} {:>6}",
            &crate::print::time(Some(d.start))[..10],
            d.gpu_hours_held,
            d.gpu_hours_used,
            share(d.gpu_hours_used, d.gpu_hours_held)
        );
    }
}
