//! Human output of the engine's answers: tables and detail views. Every field that other users
//! wrote (names, messages, commands) goes through [`esc`].

use std::time::Duration;

use anyhow::Result;
use gantry_core::clock::now_ms;
use gantry_core::gpu::BackendKind;
use gantry_core::protocol::{
    GpuStatus, GpuUser, HistoryRow, InboxInfo, JobDetailView, JobState, JobView, QueueEntryView, StatusInfo,
    UsageReport,
};
use gantry_core::units::{duration_brief_ms, duration_ms, duration_setting, format_bytes};

use crate::term::{esc, outln};

pub fn print_inbox(i: &InboxInfo, init: bool) {
    let path = esc(&i.path.display().to_string()).into_owned();
    match (i.watched, init) {
        (true, true) => outln!("Your drop folder is ready: {path}"),
        (true, false) => outln!("Your drop folder: {path} (the engine watches it)"),
        (false, _) => outln!(
            "Your drop folder: {path} (NOT watched: {})",
            esc(i.problem.as_deref().unwrap_or("see the engine's log"))
        ),
    }
    if !i.watched {
        return;
    }
    if let Some(p) = &i.problem {
        outln!("Note: {}", esc(p));
    }
    outln!("Drop a job spec (.yaml or .toml) into it to queue it as you. Each file moves to accepted/ (named");
    outln!("<job id>-<file>) or to rejected/ with <file>.error.txt saying why. Write files elsewhere and move");
    outln!("them in, or save them in place: only finished files are read.");
    if !i.lab_templates.is_empty() {
        outln!(
            "Lab templates: {}",
            i.lab_templates
                .iter()
                .map(|t| esc(t).into_owned())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let t = esc(&i.lab_templates[0]).into_owned();
        outln!("To run one on a config file: `mkdir {path}/{t}`, then drop the config file into that folder.");
    }
}

pub fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    outln!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// How long ago `ms` was, for a table column (`3m 12s`).
pub fn ago(ms: i64) -> String {
    duration_brief_ms(now_ms() - ms)
}

pub fn time(ms: Option<i64>) -> String {
    ms.map(|m| humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(m as u64)).to_string())
        .unwrap_or_else(|| "-".into())
}

/// What a job asks for, as the app's "Asks" column says it: `CPU only`, `1 GPU`, `2 GPUs`, `2x20.0 GiB`.
pub fn ask(gpus: u32, mem: Option<u64>) -> String {
    match (gpus, mem) {
        (0, _) => "CPU only".into(),
        (g, Some(m)) => format!("{g}x{}", format_bytes(m)),
        (1, None) => "1 GPU".into(),
        (g, None) => format!("{g} GPUs"),
    }
}

/// The GPUs an attempt holds or held, by index: `GPU 0,1`; `CPU only` for none.
pub fn held_gpus(gpus: &[u32]) -> String {
    if gpus.is_empty() {
        "CPU only".into()
    } else {
        format!(
            "GPU {}",
            gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(",")
        )
    }
}

pub fn print_queue(q: &[QueueEntryView]) {
    if q.is_empty() {
        outln!("no running or queued jobs");
        return;
    }
    // ASKS is the request (as in the app); where a running job runs is in STATUS.
    outln!(
        "{:>5}  {:<9} {:<10} {:<24} {:<10} {:<8} STATUS",
        "ID",
        "STATE",
        "OWNER",
        "NAME",
        "ASKS",
        "AGE"
    );
    for e in q {
        let j = &e.job;
        let status = match j.state {
            JobState::Queued => {
                let conf = e
                    .eta_confidence
                    .as_deref()
                    .map(|c| format!(", {}", esc(c)))
                    .unwrap_or_default();
                let eta = e
                    .estimated_start
                    .map(|t| {
                        format!(
                            " (starts ~{}{conf})",
                            if t <= now_ms() {
                                "now".into()
                            } else {
                                format!("in {}", duration_brief_ms(t - now_ms()))
                            }
                        )
                    })
                    .unwrap_or_default();
                format!(
                    "#{} {}{eta}",
                    e.position.unwrap_or(0),
                    esc(e.reason.as_deref().unwrap_or_default())
                )
            }
            // Running, being preempted: where, and that it is saving.
            JobState::Running if e.reason.is_some() && !e.gpus_assigned.is_empty() => format!(
                "on {} · {}",
                held_gpus(&e.gpus_assigned),
                esc(e.reason.as_deref().unwrap_or_default())
            ),
            // Submitted to Slurm and waiting there: Slurm's reason.
            _ if e.reason.is_some() => esc(e.reason.as_deref().unwrap_or_default()).into_owned(),
            _ if j.gpus == 0 => "CPU only".into(),
            // The Slurm backend learns a job's GPUs once Slurm reports them.
            _ if e.gpus_assigned.is_empty() => "on GPUs not reported yet".into(),
            _ => format!("on {}", held_gpus(&e.gpus_assigned)),
        };
        outln!(
            "{:>5}  {:<9} {:<10} {:<24} {:<10} {:<8} {}",
            j.id,
            j.state.as_str(),
            esc(&j.owner),
            trunc(&esc(&j.name), 24),
            ask(j.gpus, j.gpu_memory),
            ago(j.submitted_at),
            status
        );
    }
}

pub fn trunc(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n - 1).collect::<String>())
    }
}

pub fn print_detail(d: &JobDetailView) {
    let j = &d.job;
    outln!("job {}  {}  ({})", j.id, esc(&j.name), j.state.as_str());
    outln!("owner:     {} (uid {})", esc(&j.owner), j.owner_uid);
    outln!("image:     {}", esc(&j.image));
    print_spec(j);
    outln!(
        "gpus:      {}   priority {}   retries {}",
        ask(j.gpus, j.gpu_memory),
        j.priority,
        j.retries
    );
    outln!("submitted: {}  from {}", time(Some(j.submitted_at)), esc(&j.source));
    if let Some(r) = &d.reason {
        outln!("waiting:   {}", esc(r));
    }
    if let Some(c) = j.exit_code {
        outln!("exit code: {c}");
    }
    if let Some(m) = &j.message {
        outln!("message:   {}", esc(m));
    }
    for a in &d.attempts {
        outln!(
            "attempt {}: {} {} -> {} {} {}",
            a.n,
            held_gpus(&a.gpus),
            time(Some(a.started_at)),
            time(a.ended_at),
            a.reason.map(|r| r.as_str()).unwrap_or("running"),
            a.exit_code.map(|c| format!("(code {c})")).unwrap_or_default()
        );
    }
    if let Some(e) = &d.efficiency {
        crate::print_efficiency::print_efficiency(e);
    }
    outln!("events:");
    for e in &d.events {
        outln!(
            "  {}  {} -> {}  {}",
            time(Some(e.at)),
            esc(e.from.as_deref().unwrap_or("-")),
            esc(&e.to),
            esc(e.message.as_deref().unwrap_or(""))
        );
    }
}

/// Command, workdir, environment and mounts: the owner's and root's to see.
fn print_spec(j: &JobView) {
    let Some(v) = &j.job else {
        outln!(
            "spec:      hidden: only {} and root see its command, environment, mounts and output",
            esc(&j.owner)
        );
        return;
    };
    if let Some(c) = &v.spec.command {
        outln!("command:   {}", esc(&c.argv().join(" ")));
    }
    if let Some(w) = &v.spec.workdir {
        outln!("workdir:   {}", esc(w));
    }
    for (i, (k, val)) in v.spec.env.iter().enumerate() {
        outln!("{:<11}{}={}", if i == 0 { "env:" } else { "" }, esc(k), esc(val));
    }
    for (i, m) in v.mounts.iter().enumerate() {
        outln!(
            "{:<11}{} -> {}{}",
            if i == 0 { "mounts:" } else { "" },
            esc(&m.host),
            esc(&m.container),
            if m.read_only { " (read-only)" } else { "" }
        );
    }
}

/// `gantry status` after its first line (which engine): the engine's figures and problems.
pub fn print_status(s: &StatusInfo) {
    outln!(
        "engine pid {} (v{}), state in {}",
        s.pid,
        s.version,
        esc(&s.state_dir.display().to_string())
    );
    outln!("drop folder: {}", esc(&s.inbox.display().to_string()));
    outln!(
        "{} GPU(s), {}",
        s.gpu_count,
        esc(&backend_label(
            s.gpu_backend,
            s.gpu_note.as_deref(),
            s.gpu_library.as_deref()
        ))
    );
    if !s.reserved_gpus.is_empty() {
        outln!(
            "GPU {} kept for interactive use (lab config `gpus`): Gantry never runs jobs there",
            s.reserved_gpus
                .iter()
                .map(|g| g.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
    }
    outln!(
        "lab config: {}",
        s.config_file
            .as_ref()
            .map(|f| esc(&f.display().to_string()).into_owned())
            .unwrap_or_else(|| "none (built-in defaults)".into())
    );
    if let Some(p) = &s.store_problem {
        outln!("ERROR: {}", esc(p));
    }
    if let Some(p) = &s.backend_problem {
        outln!("WARNING: {}", esc(p));
    }
    if let Some(p) = &s.disk_problem {
        outln!("WARNING: {}", esc(p));
    }
    if let Some(n) = &s.disk_note {
        outln!("disk: {}", esc(n));
    }
    for o in &s.orphans {
        outln!(
            "WARNING: orphan container {} (job {} of a lost or replaced database, {}): left alone, its GPUs count as busy",
            esc(&o.name),
            o.job_id,
            if o.running { "running" } else { "stopped" }
        );
    }
}

fn backend_label(kind: BackendKind, note: Option<&str>, library: Option<&str>) -> String {
    match (kind, note, library) {
        (BackendKind::Nvml, _, Some(lib)) => {
            format!("NVML from {lib} (GANTRY_NVML_LIB; not the driver's library, e.g. a test double)")
        }
        (BackendKind::Nvml, _, None) => "NVML (real GPUs)".into(),
        (BackendKind::Simulated, Some(n), _) => format!("SIMULATED GPUs (NVML unavailable: {n})"),
        (BackendKind::Simulated, None, _) => "SIMULATED GPUs".into(),
    }
}

pub fn print_gpus(g: &GpuStatus) {
    if g.backend == BackendKind::Simulated || g.library.is_some() {
        outln!(
            "*** {} ***",
            esc(&backend_label(g.backend, g.note.as_deref(), g.library.as_deref()))
        );
    }
    outln!(
        "{:>3}  {:<22} {:>6} {:>21} {:>6} {:>7}  HELD BY",
        "GPU",
        "NAME",
        "UTIL",
        "MEMORY",
        "TEMP",
        "POWER"
    );
    for s in &g.gpus {
        let users: Vec<&GpuUser> = g.users.iter().filter(|u| u.gpu == s.index).collect();
        let jobs: Vec<String> = users
            .iter()
            .filter_map(|u| u.job_id)
            .map(|j| format!("job {j}"))
            .collect();
        let outside = users.iter().filter(|u| u.job_id.is_none()).count();
        let reserved = g.reserved.contains(&s.index);
        let held = match (jobs.is_empty(), outside) {
            (true, 0) if reserved => "reserved for interactive use".to_string(),
            _ if reserved => "reserved for interactive use; busy: outside Gantry".to_string(),
            (true, 0) => "free".to_string(),
            (false, 0) => jobs.join(", "),
            (true, _) => "busy: outside Gantry".to_string(),
            (false, _) => format!("{}; busy: outside Gantry", jobs.join(", ")),
        };
        outln!(
            "{:>3}  {:<22} {:>5}% {:>21} {:>6} {:>7}  {}",
            s.index,
            trunc(&esc(&s.name), 22),
            s.utilization,
            format!("{} / {}", format_bytes(s.memory_used), format_bytes(s.memory_total)),
            s.temperature_c.map(|t| format!("{t}C")).unwrap_or_else(|| "-".into()),
            s.power_w.map(|p| format!("{p:.0}W")).unwrap_or_else(|| "-".into()),
            held
        );
        if let Some(p) = &s.mig_parent {
            outln!(
                "       MIG instance {} of GPU {} ({})",
                esc(&s.uuid),
                p.index,
                esc(&p.name)
            );
        }
        for u in users {
            outln!("       {}", gpu_user_line(u));
        }
    }
    // Topology, closest links first: "NVLink: 0-1, 2-3; same PCIe switch: 0-2".
    let mut links: Vec<(gantry_core::gpu::Link, u32, u32)> = g
        .gpus
        .iter()
        .flat_map(|s| {
            s.links
                .iter()
                .filter(|l| l.peer > s.index)
                .map(|l| (l.link, s.index, l.peer))
        })
        .collect();
    links.sort();
    let mut groups: Vec<String> = vec![];
    for (i, (link, a, b)) in links.iter().enumerate() {
        if i == 0 || links[i - 1].0 != *link {
            groups.push(format!("{}: {a}-{b}", link.describe()));
        } else if let Some(last) = groups.last_mut() {
            last.push_str(&format!(", {a}-{b}"));
        }
    }
    if !groups.is_empty() {
        outln!("links: {}", groups.join("; "));
    }
}

pub fn print_usage(r: &UsageReport) {
    outln!(
        "since {} (fair share: GPU-hours halve every {})",
        time(Some(r.since_ms)),
        duration_setting(Duration::from_millis(r.fair_share_half_life_ms.max(0) as u64))
    );
    if r.users.is_empty() {
        outln!("no use in this window");
        return;
    }
    // "GPU-hours preempted" only where preemption happened in the window.
    let pre = r.users.iter().any(|u| u.gpu_hours_preempted > 0.0);
    let head = if pre {
        format!(" {:>10}", "PREEMPTED")
    } else {
        String::new()
    };
    outln!(
        "{:<16} {:>10} {:>6} {:>12} {:>11}{head}",
        "USER",
        "GPU-HOURS",
        "JOBS",
        "MEAN WAIT",
        "FAIR SHARE"
    );
    for u in &r.users {
        let p = if pre {
            format!(" {:>10.2}", u.gpu_hours_preempted)
        } else {
            String::new()
        };
        outln!(
            "{:<16} {:>10.2} {:>6} {:>12} {:>11.2}{p}",
            trunc(&esc(&u.user), 16),
            u.gpu_hours,
            u.jobs_finished,
            u.mean_wait_ms.map(duration_brief_ms).unwrap_or_else(|| "-".into()),
            u.fair_share_usage
        );
    }
}

/// "job 12 train (alice), 3.0 GiB" or "outside Gantry (pid 1234, user bob, command python x.py) in
/// container bob-nb, 3.0 GiB". Every field is escaped: process commands are anyone's text.
fn gpu_user_line(u: &GpuUser) -> String {
    let mut line = match u.job_id {
        Some(j) => format!(
            "job {j} {} ({})",
            esc(u.job_name.as_deref().unwrap_or("?")),
            esc(u.user.as_deref().unwrap_or("?"))
        ),
        None => {
            let mut what = vec![];
            if let Some(p) = u.pid {
                what.push(format!("pid {p}"));
                what.push(format!("user {}", esc(u.user.as_deref().unwrap_or("?"))));
                what.push(format!("command {}", esc(u.command.as_deref().unwrap_or("?"))));
            }
            let mut s = if what.is_empty() {
                "outside Gantry".to_string()
            } else {
                format!("outside Gantry ({})", what.join(", "))
            };
            if let Some(c) = &u.container {
                s.push_str(&format!(" in container {}", esc(c)));
            }
            s
        }
    };
    if let Some(m) = u.used_memory {
        line.push_str(&format!(", {}", format_bytes(m)));
    }
    // Outside Gantry, on a GPU at 0 % for a while: for an admin to act on (the engine says from when).
    if let Some(since) = u.idle_since.filter(|_| u.job_id.is_none()) {
        line.push_str(&format!(
            ", idle for {}",
            gantry_core::units::duration_words_ms(now_ms() - since)
        ));
    }
    line
}

pub fn print_history(rows: &[HistoryRow], metric: Option<&str>) {
    if rows.is_empty() {
        outln!("no completed runs match");
        return;
    }
    // ON GPU: the GPUs it ran on, by index (`gantry ls` shows the request under ASKS).
    // `--metric M`: its last value, after the other columns.
    let extra = |v: String| {
        if metric.is_some() {
            format!("  {v}")
        } else {
            String::new()
        }
    };
    outln!(
        "{:>5}  {:<10} {:<10} {:<24} {:<5} {:<8} {:<20} {:>9}{}",
        "ID",
        "STATUS",
        "OWNER",
        "NAME",
        "CODE",
        "ON GPU",
        "FINISHED",
        "DURATION",
        extra(metric.map(esc).unwrap_or_default().to_uppercase())
    );
    for r in rows {
        let dur = match (r.started_at, r.finished_at) {
            (Some(s), Some(f)) => duration_ms(f - s),
            _ => "-".into(),
        };
        outln!(
            "{:>5}  {:<10} {:<10} {:<24} {:<5} {:<8} {:<20} {:>9}{}",
            r.id,
            r.status.as_str(),
            esc(&r.owner),
            trunc(&esc(&r.name), 24),
            r.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
            if r.gpus.is_empty() {
                "-".to_string()
            } else {
                r.gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(",")
            },
            time(r.finished_at),
            dur,
            extra(r.metric.map(|m| m.to_string()).unwrap_or_else(|| "-".into()))
        );
    }
}
