//! `gantry`: the command-line client (and `gantry daemon`, the engine).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use gantry_core::api::{PriorityRequest, StatusInfo};
use gantry_core::client::{Client, ClientError};
use gantry_core::engine::{Config, GpuStatus, JobDetail, Paths, QueueEntry};
use gantry_core::gpu::BackendKind;
use gantry_core::spec::format_bytes;
use gantry_core::store::{now_ms, HistoryRow, JobState};

#[derive(Parser)]
#[command(name = "gantry", version, about = "A fair, self-service GPU job queue for a shared workstation")]
struct Cli {
    /// Keep the database, logs and socket under DIR (default: $XDG_STATE_HOME/gantry).
    #[arg(long, global = true, env = "GANTRY_STATE_DIR", value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the engine (one per machine).
    Daemon {
        /// Simulated GPUs, e.g. `sim:2x24GiB` (default: NVML when the NVIDIA driver loads).
        #[arg(long)]
        gpus: Option<String>,
        /// Drop folder (default: ~/Gantry/inbox, or STATE_DIR/inbox with --state-dir).
        #[arg(long)]
        inbox: Option<PathBuf>,
        /// A job that cannot start for this long reserves GPUs (no starvation).
        #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
        reserve_after: Duration,
        /// Time between SIGTERM and SIGKILL on cancel and timeout.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        stop_grace: Duration,
        /// First retry delay (doubles per attempt).
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        retry_backoff: Duration,
    },
    /// Queue job spec files (YAML or TOML).
    Submit {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Running and queued jobs, and why each queued job waits.
    Ls,
    /// One job: spec, attempts, events.
    Show { id: i64 },
    /// A job's output.
    Logs {
        id: i64,
        /// Keep printing until the job ends.
        #[arg(short, long)]
        follow: bool,
    },
    /// Cancel a job (SIGTERM, then SIGKILL after the grace period).
    Cancel { id: i64 },
    /// Change a queued job's priority (higher runs first).
    Priority { id: i64, priority: i32 },
    /// GPUs, their load and who holds them.
    Gpus,
    /// Completed runs, newest first.
    History {
        #[arg(long)]
        user: Option<String>,
        /// succeeded, failed, cancelled or timed_out
        #[arg(long)]
        status: Option<String>,
        /// Finished within this long ago (`2h`, `7d`) or since an RFC 3339 time.
        #[arg(long)]
        since: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Print the JSON Schema of the job spec (for editors).
    Schema,
    /// Engine status.
    Status,
    /// Replay a workload trace through the scheduler on a virtual clock (no Docker, no sleeping).
    Sim {
        /// Gantry CSV (`submit_s,duration_s,gpus,gpu_memory,user,priority`) or Alibaba GPU-cluster CSV.
        #[arg(long)]
        trace: PathBuf,
        /// The machine: `8x32GiB`.
        #[arg(long, default_value = "8x32GiB")]
        gpus: String,
        /// serial, fifo, greedy, gantry, or all (default: all, side by side).
        #[arg(long, default_value = "all")]
        policy: String,
        /// Rescale arrivals so offered GPU demand is L x capacity (1.2 = saturated queue).
        #[arg(long)]
        load: Option<f64>,
        /// Give the scheduler the trace's durations as declared runtimes (gantry policy).
        #[arg(long)]
        runtimes: bool,
        /// Reservation threshold for the gantry policy.
        #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
        reserve_after: Duration,
        /// A job reserves GPUs once it waited this many times the typical wait (gantry policy).
        #[arg(long, default_value_t = 3.0)]
        reserve_factor: f64,
        /// Placement of shared (gpu_memory) jobs: best-fit or worst-fit.
        #[arg(long, default_value = "best-fit")]
        packing: String,
        /// Fair share between users: decay GPU-hours with this half-life (e.g. `24h`); off by default.
        #[arg(long, value_parser = humantime::parse_duration)]
        fair_share: Option<Duration>,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gantry: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn paths(cli: &Cli, inbox: Option<PathBuf>) -> Paths {
    let state_dir = cli.state_dir.clone().unwrap_or_else(Paths::default_state_dir);
    let inbox = inbox.unwrap_or_else(|| if cli.state_dir.is_some() { state_dir.join("inbox") } else { Paths::default_inbox() });
    Paths { state_dir, inbox }
}

fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

async fn run(cli: Cli) -> Result<std::process::ExitCode> {
    let client = Client::new(paths(&cli, None).socket());
    match &cli.cmd {
        Cmd::Daemon { gpus, inbox, reserve_after, stop_grace, retry_backoff } => {
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .init();
            let mut cfg = Config::new(paths(&cli, inbox.clone()));
            cfg.gpus = gpus.clone();
            cfg.scheduler.reserve_after_ms = reserve_after.as_millis() as i64;
            cfg.stop_grace = *stop_grace;
            cfg.retry_backoff = *retry_backoff;
            gantry_core::daemon::run(cfg, async {
                let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
                tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} }
            })
            .await
            .context("the engine stopped")?;
        }
        Cmd::Submit { files } => return submit(&client, files, cli.json).await,
        Cmd::Ls => {
            let q: Vec<QueueEntry> = client.get("/v1/jobs").await?;
            if cli.json {
                print_json(&q)?;
            } else {
                print_queue(&q);
            }
        }
        Cmd::Show { id } => {
            let d: JobDetail = client.get(&format!("/v1/jobs/{id}")).await?;
            if cli.json {
                print_json(&d)?;
            } else {
                print_detail(&d);
            }
        }
        Cmd::Logs { id, follow } => {
            use std::io::Write;
            if *follow {
                client
                    .stream(&format!("/v1/jobs/{id}/logs?follow=true"), |chunk| {
                        let mut out = std::io::stdout().lock();
                        out.write_all(chunk).and_then(|_| out.flush()).is_ok()
                    })
                    .await?;
            } else {
                std::io::stdout().write_all(&client.raw(&format!("/v1/jobs/{id}/logs")).await?)?;
            }
        }
        Cmd::Cancel { id } => {
            let before: JobState = client.post(&format!("/v1/jobs/{id}/cancel"), &()).await?;
            match before {
                JobState::Queued => println!("job {id} cancelled"),
                JobState::Starting | JobState::Running => println!("job {id} is being stopped (SIGTERM, then SIGKILL after the grace period)"),
                s => println!("job {id} had already ended ({})", s.as_str()),
            }
        }
        Cmd::Priority { id, priority } => {
            let ok: bool = client.post(&format!("/v1/jobs/{id}/priority"), &PriorityRequest { priority: *priority }).await?;
            if !ok {
                bail!("job {id} is no longer queued; only queued jobs change priority");
            }
            println!("job {id} priority set to {priority}");
        }
        Cmd::Gpus => {
            let g: GpuStatus = client.get("/v1/gpus").await?;
            if cli.json {
                print_json(&g)?;
            } else {
                print_gpus(&g);
            }
        }
        Cmd::History { user, status, since, limit } => {
            let mut q = vec![format!("limit={limit}")];
            if let Some(u) = user {
                q.push(format!("user={}", urlencode(u)));
            }
            if let Some(s) = status {
                if JobState::parse(s).is_none() {
                    bail!("unknown status {s:?}: use succeeded, failed, cancelled or timed_out");
                }
                q.push(format!("status={s}"));
            }
            if let Some(s) = since {
                q.push(format!("since={}", parse_since(s)?));
            }
            let rows: Vec<HistoryRow> = client.get(&format!("/v1/history?{}", q.join("&"))).await?;
            if cli.json {
                print_json(&rows)?;
            } else {
                print_history(&rows);
            }
        }
        Cmd::Schema => print_json(&gantry_core::spec::json_schema())?,
        Cmd::Sim { trace, gpus, policy, load, runtimes, reserve_after, reserve_factor, packing, fair_share } => {
            let mut sched = gantry_core::scheduler::Config { reserve_after_ms: reserve_after.as_millis() as i64, reserve_factor: *reserve_factor, ..Default::default() };
            sched.packing = match packing.as_str() {
                "best-fit" => gantry_core::scheduler::Packing::BestFit,
                "worst-fit" => gantry_core::scheduler::Packing::WorstFit,
                p => bail!("unknown packing {p:?}: best-fit or worst-fit"),
            };
            let reports = sim(trace, gpus, policy, *load, *runtimes, sched, *fair_share)?;
            if cli.json {
                print_json(&reports)?;
            } else {
                print_sim(&reports);
            }
        }
        Cmd::Status => {
            let s: StatusInfo = client.get("/v1/status").await?;
            if cli.json {
                print_json(&s)?;
            } else {
                println!("engine pid {} (v{}), state in {}", s.pid, s.version, s.state_dir.display());
                println!("drop folder: {}", s.inbox.display());
                println!("{} GPU(s), {}", s.gpu_count, backend_label(s.gpu_backend, s.gpu_note.as_deref()));
                if let Some(p) = s.docker_problem {
                    println!("WARNING: {p}");
                }
            }
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

fn parse_since(s: &str) -> Result<i64> {
    if let Ok(d) = humantime::parse_duration(s) {
        return Ok(now_ms() - d.as_millis() as i64);
    }
    let t = humantime::parse_rfc3339_weak(s).with_context(|| format!("--since {s:?}: write a duration like `2h` or a time like `2026-11-01T09:00:00`"))?;
    Ok(t.duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64)
}

async fn submit(client: &Client, files: &[PathBuf], json: bool) -> Result<std::process::ExitCode> {
    let mut failed = false;
    let mut ids = vec![];
    for f in files {
        match submit_one(client, f).await {
            Ok(new) => {
                ids.push(serde_json::json!({"file": f, "job_id": new[0], "job_ids": new}));
                if !json {
                    match new.as_slice() {
                        [one] => println!("{}: queued as job {one}", f.display()),
                        many => println!("{}: queued {} jobs: {}", f.display(), many.len(), many.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")),
                    }
                }
            }
            Err(e) => {
                failed = true;
                if let Some(ClientError::NoEngine(_)) = e.downcast_ref::<ClientError>() {
                    return Err(e);
                }
                ids.push(serde_json::json!({"file": f, "error": format!("{e:#}")}));
                if !json {
                    eprintln!("{}: {e:#}", f.display());
                }
            }
        }
    }
    if json {
        print_json(&ids)?;
    }
    Ok(if failed { std::process::ExitCode::FAILURE } else { std::process::ExitCode::SUCCESS })
}

async fn submit_one(client: &Client, f: &Path) -> Result<Vec<i64>> {
    Ok(client.submit_file(f).await?)
}

fn human_delta(ms: i64) -> String {
    humantime::format_duration(Duration::from_secs((ms / 1000).max(0) as u64)).to_string().split(' ').take(2).collect::<Vec<_>>().join(" ")
}

fn ago(ms: i64) -> String {
    let s = ((now_ms() - ms) / 1000).max(0) as u64;
    humantime::format_duration(Duration::from_secs(s)).to_string().split(' ').take(2).collect::<Vec<_>>().join(" ")
}

fn time(ms: Option<i64>) -> String {
    ms.map(|m| humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(m as u64)).to_string()).unwrap_or_else(|| "-".into())
}

fn ask(gpus: u32, mem: Option<u64>) -> String {
    match mem {
        Some(m) => format!("{gpus}x{}", format_bytes(m)),
        None => format!("{gpus}"),
    }
}

fn print_queue(q: &[QueueEntry]) {
    if q.is_empty() {
        println!("no running or queued jobs");
        return;
    }
    println!("{:>5}  {:<9} {:<10} {:<24} {:<10} {:<8} STATUS", "ID", "STATE", "OWNER", "NAME", "GPUS", "AGE");
    for e in q {
        let j = &e.job;
        let status = match j.state {
            JobState::Queued => {
                let eta = e.estimated_start.map(|t| format!(" (starts ~{})", if t <= now_ms() { "now".into() } else { format!("in {}", human_delta(t - now_ms())) })).unwrap_or_default();
                format!("#{} {}{eta}", e.position.unwrap_or(0), e.reason.clone().unwrap_or_default())
            }
            _ => format!("on GPU {}", e.gpus_assigned.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(",")),
        };
        println!("{:>5}  {:<9} {:<10} {:<24} {:<10} {:<8} {}", j.id, j.state.as_str(), j.owner, trunc(&j.name, 24), ask(j.gpus, j.gpu_memory), ago(j.submitted_at), status);
    }
}

fn trunc(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_string() } else { format!("{}…", s.chars().take(n - 1).collect::<String>()) }
}

fn print_detail(d: &JobDetail) {
    let j = &d.job;
    println!("job {}  {}  ({})", j.id, j.name, j.state.as_str());
    println!("owner:     {} (uid {})", j.owner, j.owner_uid);
    println!("image:     {}", j.image);
    if let Some(c) = &j.job.spec.command {
        println!("command:   {}", c.argv().join(" "));
    }
    println!("gpus:      {}   priority {}   retries {}", ask(j.gpus, j.gpu_memory), j.priority, j.retries);
    println!("submitted: {}  from {}", time(Some(j.submitted_at)), j.source);
    if let Some(r) = &d.reason {
        println!("waiting:   {r}");
    }
    if let Some(c) = j.exit_code {
        println!("exit code: {c}");
    }
    if let Some(m) = &j.message {
        println!("message:   {m}");
    }
    for a in &d.attempts {
        println!(
            "attempt {}: GPU [{}] {} -> {} {} {}",
            a.n,
            a.gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(","),
            time(Some(a.started_at)),
            time(a.ended_at),
            a.reason.map(|r| r.as_str()).unwrap_or("running"),
            a.exit_code.map(|c| format!("(code {c})")).unwrap_or_default()
        );
    }
    println!("events:");
    for e in &d.events {
        println!("  {}  {} -> {}  {}", time(Some(e.at)), e.from.as_deref().unwrap_or("-"), e.to, e.message.as_deref().unwrap_or(""));
    }
}

fn backend_label(kind: BackendKind, note: Option<&str>) -> String {
    match (kind, note) {
        (BackendKind::Nvml, _) => "NVML (real GPUs)".into(),
        (BackendKind::Simulated, Some(n)) => format!("SIMULATED GPUs (NVML unavailable: {n})"),
        (BackendKind::Simulated, None) => "SIMULATED GPUs".into(),
    }
}

fn print_gpus(g: &GpuStatus) {
    if g.backend == BackendKind::Simulated {
        println!("*** {} ***", backend_label(g.backend, g.note.as_deref()));
    }
    println!("{:>3}  {:<22} {:>6} {:>21} {:>6} {:>7}  HELD BY", "GPU", "NAME", "UTIL", "MEMORY", "TEMP", "POWER");
    for s in &g.gpus {
        let holders = g.holders.iter().find(|(i, _)| *i == s.index).map(|(_, j)| j.iter().map(|j| format!("job {j}")).collect::<Vec<_>>().join(", ")).unwrap_or_default();
        let external = s.processes.iter().filter(|p| p.container_id.is_none()).count();
        let held = match (holders.is_empty(), external) {
            (true, 0) => "-".to_string(),
            (false, 0) => holders,
            (true, n) => format!("{n} process(es) outside Gantry"),
            (false, n) => format!("{holders}; {n} process(es) outside Gantry"),
        };
        println!(
            "{:>3}  {:<22} {:>5}% {:>21} {:>6} {:>7}  {}",
            s.index,
            trunc(&s.name, 22),
            s.utilization,
            format!("{} / {}", format_bytes(s.memory_used), format_bytes(s.memory_total)),
            s.temperature_c.map(|t| format!("{t}C")).unwrap_or_else(|| "-".into()),
            s.power_w.map(|p| format!("{p:.0}W")).unwrap_or_else(|| "-".into()),
            held
        );
    }
}

fn print_history(rows: &[HistoryRow]) {
    if rows.is_empty() {
        println!("no completed runs match");
        return;
    }
    println!("{:>5}  {:<10} {:<10} {:<24} {:<5} {:<8} {:<20} {:>9}", "ID", "STATUS", "OWNER", "NAME", "CODE", "GPUS", "FINISHED", "DURATION");
    for r in rows {
        let dur = match (r.started_at, r.finished_at) {
            (Some(s), Some(f)) => humantime::format_duration(Duration::from_secs(((f - s) / 1000).max(0) as u64)).to_string(),
            _ => "-".into(),
        };
        println!(
            "{:>5}  {:<10} {:<10} {:<24} {:<5} {:<8} {:<20} {:>9}",
            r.id,
            r.status.as_str(),
            r.owner,
            trunc(&r.name, 24),
            r.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
            r.gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(","),
            time(r.finished_at),
            dur
        );
    }
}

fn sim(
    trace: &Path,
    gpus: &str,
    policy: &str,
    load: Option<f64>,
    runtimes: bool,
    sched: gantry_core::scheduler::Config,
    fair_share: Option<Duration>,
) -> Result<Vec<gantry_core::sim::Report>> {
    use gantry_core::sim::{self, Policy, SimConfig};
    let b = gantry_core::gpu::SimulatedBackend::from_spec(gpus)?;
    let (n, mem) = b.shape();
    let mut t = sim::load_trace(trace, n)?;
    if let Some(l) = load {
        sim::rescale_load(&mut t.jobs, n, l);
    }
    let policies: Vec<Policy> = if policy == "all" {
        Policy::ALL.to_vec()
    } else {
        vec![Policy::parse(policy).with_context(|| format!("unknown policy {policy:?}: serial, fifo, greedy, gantry or all"))?]
    };
    let mut out = vec![];
    for p in policies {
        let mut cfg = SimConfig { gpus: n, gpu_memory: mem, policy: p, declared_runtimes: false, scheduler: sched.clone(), fair_share_half_life_s: fair_share.map(|d| d.as_secs_f64()) };
        out.push(sim::simulate(&t, &cfg));
        if p == Policy::Gantry && (runtimes || policy == "all") {
            cfg.declared_runtimes = true;
            out.push(sim::simulate(&t, &cfg));
        }
    }
    Ok(out)
}

fn print_sim(reports: &[gantry_core::sim::Report]) {
    let Some(r0) = reports.first() else { return };
    println!("{} jobs on {} GPUs ({} CPU-only and {} too-large tasks dropped)", r0.jobs, r0.gpus, r0.dropped_cpu_only, r0.dropped_too_big);
    println!("{:<18} {:>12} {:>9} {:>11} {:>12} {:>12} {:>14}", "policy", "makespan", "xLB", "alloc/wait", "mean wait", "p95 wait", "wait 4+/1 GPU");
    let h = |s: f64| humantime::format_duration(Duration::from_secs(s as u64)).to_string().split(' ').take(2).collect::<Vec<_>>().join(" ");
    for r in reports {
        let w1 = r.mean_wait_by_gpus.get(&1).copied().unwrap_or(0.0);
        let big: Vec<f64> = r.mean_wait_by_gpus.iter().filter(|(g, _)| **g >= 4).map(|(_, w)| *w).collect();
        let ratio = if big.is_empty() || w1 == 0.0 { "-".to_string() } else { format!("{:.2}", big.iter().sum::<f64>() / big.len() as f64 / w1) };
        println!(
            "{:<18} {:>12} {:>9.3} {:>10.1}% {:>12} {:>12} {:>14}",
            r.policy, h(r.makespan_s), r.makespan_ratio, 100.0 * r.alloc_share_while_waiting, h(r.mean_wait_s), h(r.p95_wait_s), ratio
        );
    }
    println!("lower bound: {}", h(r0.lower_bound_s));
    if r0.user_share.len() > 1 {
        for r in reports {
            let shares: Vec<String> = r.user_share.iter().map(|(u, s)| format!("{u} {:.1}%", s * 100.0)).collect();
            let waits: Vec<String> = r.mean_wait_by_user.iter().map(|(u, w)| format!("{u} {}", h(*w))).collect();
            println!("{:<18} GPU share under contention: {}; mean wait: {}", r.policy, shares.join(", "), waits.join(", "));
        }
    }
}
