//! `gantry`: the command-line client (and `gantry daemon`, the engine).

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use gantry_core::api::{JobDetailView, JobView, PriorityRequest, QueueEntryView, StatusInfo, SubmitRequest, Submitted, WhoAmI};
use gantry_core::client::{Client, ClientError, FoundBy, Target};
use gantry_core::engine::{Config, GpuStatus, GpuUser, Paths};
use gantry_core::gpu::BackendKind;
use gantry_core::inbox::users::InboxInfo;
use std::os::unix::fs::DirBuilderExt;
use gantry_core::spec::format_bytes;
use gantry_core::config::Overrides;
use gantry_core::policy::{LabConfig, SYSTEM_CONFIG};
use gantry_core::store::{now_ms, HistoryRow, JobState, UsageReport};

#[derive(Parser)]
#[command(name = "gantry", version, about = "A fair, self-service GPU job queue for a shared workstation")]
struct Cli {
    /// Keep the database, logs and socket under DIR (default: $XDG_STATE_HOME/gantry).
    #[arg(long, global = true, env = "GANTRY_STATE_DIR", value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Use the engine of a workstation reached with ssh (`user@host` or a ~/.ssh/config Host): runs
    /// `ssh HOST gantry proxy`, so you act there as the ssh user.
    #[arg(long, global = true, env = "GANTRY_HOST", value_name = "HOST")]
    host: Option<String>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    json: bool,
    /// How long to wait for the engine's answer (tests shorten it).
    #[arg(long, global = true, hide = true, env = "GANTRY_CLIENT_TIMEOUT", value_parser = humantime::parse_duration)]
    client_timeout: Option<Duration>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the engine (one per machine).
    Daemon {
        /// Be the machine's engine, for every user: state in /var/lib/gantry, socket /run/gantry/gantry.sock.
        #[arg(long, conflicts_with = "state_dir")]
        system: bool,
        /// With --system: put /var/lib/gantry and /run/gantry under DIR (tests).
        #[arg(long, hide = true, env = "GANTRY_SYSTEM_ROOT", value_name = "DIR", default_value = "/")]
        system_root: PathBuf,
        /// Simulated GPUs, e.g. `sim:2x24GiB` (default: NVML when the NVIDIA driver loads).
        #[arg(long)]
        gpus: Option<String>,
        /// Drop folder (default: ~/Gantry/inbox, or STATE_DIR/inbox with --state-dir).
        #[arg(long)]
        inbox: Option<PathBuf>,
        /// Lab config (limits, admins, retention; see `gantry config check`). Default: /etc/gantry/config.toml
        /// with --system, none otherwise. SIGHUP re-reads it.
        #[arg(long, env = "GANTRY_CONFIG", value_name = "FILE")]
        config: Option<PathBuf>,
        /// A job that cannot start for this long reserves GPUs (no starvation) [default: 30m, or the lab config's].
        #[arg(long, value_parser = humantime::parse_duration)]
        reserve_after: Option<Duration>,
        /// Time between SIGTERM and SIGKILL on cancel and timeout [default: 10s, or the lab config's].
        #[arg(long, value_parser = humantime::parse_duration)]
        stop_grace: Option<Duration>,
        /// First retry delay, doubling per attempt [default: 10s, or the lab config's].
        #[arg(long, value_parser = humantime::parse_duration)]
        retry_backoff: Option<Duration>,
        /// API: close a connection whose request head has not arrived after this long (tests shorten it).
        #[arg(long, hide = true, value_parser = humantime::parse_duration)]
        header_timeout: Option<Duration>,
        /// With --system: members of this group get their drop folder made and watched (tests; the
        /// lab config's `[inbox] group`).
        #[arg(long, hide = true, value_name = "GROUP")]
        inbox_group: Option<String>,
        /// With --system: each user's drop folder, relative to their home (tests; `[inbox] path`).
        #[arg(long, hide = true, value_name = "PATH")]
        inbox_path: Option<PathBuf>,
        /// On a Slurm node: no engine; write this node's GPU samples (NVML, or --gpus) to DIR/<node>.json
        /// every second, for the engine's GPUs view (`[slurm] node_samples`).
        #[arg(long, value_name = "DIR")]
        node_agent: Option<PathBuf>,
    },
    /// Queue job spec files (YAML or TOML).
    Submit {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Queue a job from flags, without writing a file: `gantry run --gpus 1 --image IMG -- python train.py`.
    Run(RunArgs),
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
    /// Queue one of your jobs again, with the same spec.
    Rerun { id: i64 },
    /// Cancel a job (SIGTERM, then SIGKILL after the grace period).
    Cancel { id: i64 },
    /// Change a queued job's priority (higher runs first).
    Priority { id: i64, priority: i32 },
    /// Keep a queued job from starting (until `gantry release`).
    Hold { id: i64 },
    /// Let a held job start again.
    Release { id: i64 },
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
    /// The lab config (/etc/gantry/config.toml).
    Config {
        #[command(subcommand)]
        cmd: ConfigCmd,
    },
    /// GPU-hours, jobs finished and mean wait per user: the numbers fair share acts on.
    Usage {
        /// The window: this long ago until now (`7d`, `24h`) or since an RFC 3339 time.
        #[arg(long, default_value = "7d")]
        since: String,
    },
    /// Engine status.
    Status,
    /// Join stdin/stdout to this machine's engine: what `gantry --host` and the app run through ssh.
    Proxy,
    /// Write shell completions (bash, zsh, fish) and the man page into DIR (used by scripts/package.sh).
    #[command(hide = true)]
    Generate {
        dir: PathBuf,
    },
    /// Your drop folder: where it is, whether the engine watches it, and the lab's templates.
    Inbox {
        #[command(subcommand)]
        action: Option<InboxAction>,
    },
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
        /// Jobs asking for 2+ GPUs reserve once they waited this many times the typical wait.
        #[arg(long)]
        wide_reserve_factor: Option<f64>,
        /// A 1-GPU job past the threshold: `age` (goes first) or `reserve` (holds a GPU).
        #[arg(long, default_value = "reserve")]
        narrow: String,
        /// Reserve only when the GPUs are expected to drain within F x the longer of the typical wait
        /// and the job's own wait (`none`: always reserve).
        #[arg(long, default_value = "1")]
        drain_limit: String,
        /// Wide jobs share one drain (`on`) or each drains for itself (`off`).
        #[arg(long, default_value = "on")]
        share_drains: String,
        /// Order (with runtimes): `sjf` (shortest work first) or `hrrn` (highest response ratio).
        #[arg(long, default_value = "sjf")]
        order: String,
        /// Replay only the jobs after this fraction of the trace (by arrival), e.g. 0.5 = the second
        /// half: a held-out split.
        #[arg(long, default_value_t = 0.0)]
        from_fraction: f64,
        /// Placement of shared (gpu_memory) jobs: fgd (least growth of fragmentation for the recent mix
        /// of request shapes), best-fit or worst-fit.
        #[arg(long, default_value = "fgd")]
        packing: String,
        /// Without --runtimes, what the gantry policy knows of runtimes: `learned` (estimates from
        /// the jobs completed so far, as the engine does) or `none`.
        #[arg(long, default_value = "learned")]
        estimates: String,
        /// Repeat over N arrival perturbations (seed 0 = the trace as recorded) and report each
        /// figure as mean ± 95% confidence interval.
        #[arg(long, default_value_t = 1)]
        seeds: u64,
        /// `queue` (default: arrivals and completions on a virtual clock) or `fgd` (the FGD paper's:
        /// arrivals only in shuffled order, a task that does not fit fails, stop once 130% of the
        /// capacity was requested; reports the GPU allocation ratio).
        #[arg(long, default_value = "queue")]
        protocol: String,
        /// With --protocol fgd: how many machines of --gpus (each task goes to the machine where the
        /// packing rule scores it best).
        #[arg(long, default_value_t = 1)]
        nodes: u32,
        /// Fair share between users: decay GPU-hours with this half-life (e.g. `24h`); off by default.
        #[arg(long, value_parser = humantime::parse_duration)]
        fair_share: Option<Duration>,
    },
}

#[derive(Subcommand)]
enum ConfigCmd {
    /// Check a lab config: prints OK, or each problem with its line and column (exit status 1).
    Check {
        /// Default: the file the engine would read ($GANTRY_CONFIG, else /etc/gantry/config.toml).
        #[arg(env = "GANTRY_CONFIG")]
        file: Option<PathBuf>,
    },
}

/// `gantry run`: the fields of a job spec as flags; the engine checks them as if written in a file.
#[derive(clap::Args)]
struct RunArgs {
    /// Docker image.
    #[arg(long)]
    image: String,
    /// Number of GPUs (0 for a CPU-only job).
    #[arg(long, default_value_t = 1)]
    gpus: i64,
    /// GPU memory per GPU (`20GiB`): share GPUs instead of taking whole ones.
    #[arg(long, value_name = "SIZE")]
    mem: Option<String>,
    /// Only GPUs whose name contains this, any case (`H100`); `gantry gpus` lists the names.
    #[arg(long, value_name = "NAME")]
    gpu_type: Option<String>,
    /// Only GPUs with at least this much memory in all (`40GiB`).
    #[arg(long, value_name = "SIZE")]
    min_gpu_memory: Option<String>,
    /// CPUs the job may use (`8`, `0.5`). Default: the lab's share per GPU.
    #[arg(long)]
    cpus: Option<f64>,
    /// RAM the job may use (`64GiB`); not GPU memory (that is `--mem`). Default: the lab's share per GPU.
    #[arg(long, value_name = "SIZE")]
    memory: Option<String>,
    /// Size of /dev/shm (`16GiB`). Default: half the job's memory limit.
    #[arg(long, value_name = "SIZE")]
    shm_size: Option<String>,
    /// Job name (default: the program's name).
    #[arg(long)]
    name: Option<String>,
    /// Higher runs first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    /// Wall-clock limit (`24h`, `90m`).
    #[arg(long)]
    timeout: Option<String>,
    /// Environment variable for the job (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    env: Vec<String>,
    /// Bind mount `host:container[:ro]` (repeatable); relative host paths are from here.
    #[arg(long = "mount", value_name = "HOST:CONTAINER[:ro]")]
    mounts: Vec<String>,
    /// Working directory inside the container.
    #[arg(long)]
    workdir: Option<String>,
    /// Run this string with `/bin/sh -c` instead of a command after `--`.
    #[arg(long, conflicts_with = "command")]
    shell: Option<String>,
    /// The program and its arguments, run as is (no shell). Default: the image's CMD.
    /// Everything after `--` belongs to the job, so global flags (`--json`) go before it.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

impl RunArgs {
    /// The spec a user would have written, as YAML text (serialized, so any value quotes right).
    fn spec_text(&self) -> Result<(String, String)> {
        use gantry_core::spec::{Command, JobSpec};
        let mut env = std::collections::BTreeMap::new();
        for kv in &self.env {
            let Some((k, v)) = kv.split_once('=') else { bail!("--env {kv:?} is not K=V: write e.g. --env CUDA_LAUNCH_BLOCKING=1") };
            env.insert(k.to_string(), v.to_string());
        }
        let command = match (&self.shell, self.command.is_empty()) {
            (Some(s), _) => Some(Command::Shell(s.clone())),
            (None, false) => Some(Command::Exec(self.command.clone())),
            (None, true) => None,
        };
        let name = self.name.clone().unwrap_or_else(|| match self.command.first() {
            Some(prog) => prog.rsplit('/').next().unwrap_or(prog).to_string(),
            None => self.image.rsplit('/').next().unwrap_or(&self.image).split(':').next().unwrap_or("run").to_string(),
        });
        let spec = JobSpec {
            name: Some(name.clone()),
            image: self.image.clone(),
            command,
            workdir: self.workdir.clone(),
            env,
            mounts: self.mounts.clone(),
            gpus: self.gpus,
            gpu_memory: self.mem.clone(),
            gpu_type: self.gpu_type.clone(),
            min_gpu_memory: self.min_gpu_memory.clone(),
            priority: self.priority,
            timeout: self.timeout.clone(),
            retries: 0,
            expected_runtime: None,
            after: vec![],
            matrix: Default::default(),
            cpus: self.cpus,
            memory: self.memory.clone(),
            shm_size: self.shm_size.clone(),
            ipc: None,
            home: None,
            ulimits: None,
            pids_limit: None,
        };
        Ok((serde_yaml_ng::to_string(&spec)?, format!("{name}.yaml")))
    }
}

#[derive(Subcommand)]
enum InboxAction {
    /// Create your drop folder (as you) and have the engine watch it, from now on.
    Init,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gantry: {}", escape(&format!("{e:#}"), "\n"));
            std::process::ExitCode::FAILURE
        }
    }
}

fn paths(cli: &Cli, inbox: Option<PathBuf>) -> Paths {
    let state_dir = cli.state_dir.clone().unwrap_or_else(Paths::default_state_dir);
    let inbox = inbox.unwrap_or_else(|| if cli.state_dir.is_some() { state_dir.join("inbox") } else { Paths::default_inbox() });
    Paths::in_dir(state_dir, inbox)
}

/// `println!` that exits quietly once stdout is closed (`gantry ls | head -1`) instead of panicking.
/// SIGPIPE stays ignored: the CLI also writes to the engine's socket, and dying of SIGPIPE there
/// would hide the engine's error.
macro_rules! outln {
    ($($arg:tt)*) => { write_out(format!("{}\n", format_args!($($arg)*)).as_bytes()) };
}

fn write_out(bytes: &[u8]) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(bytes).and_then(|_| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("gantry: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

/// Control characters (and bidi overrides) in `s` as visible escapes (`\u{1b}`), except those in
/// `keep`: names, messages and output come from other users and must not drive the reader's terminal.
fn escape<'a>(s: &'a str, keep: &str) -> Cow<'a, str> {
    let bad = |c: char| (c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')) && !keep.contains(c);
    if !s.chars().any(bad) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(s.chars().map(|c| if bad(c) { c.escape_default().to_string() } else { c.to_string() }).collect())
}

/// A one-line field of human output.
fn esc(s: &str) -> Cow<'_, str> {
    escape(s, "")
}

/// Completions for bash, zsh and fish, and `gantry.1`, generated from the same clap definition the CLI
/// parses with, so they cannot drift from it.
fn generate(dir: &Path) -> Result<()> {
    use clap::CommandFactory;
    use clap_complete::Shell;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let path = clap_complete::generate_to(shell, &mut Cli::command(), "gantry", dir).with_context(|| format!("cannot write {shell} completions into {}", dir.display()))?;
        outln!("{}", path.display());
    }
    let mut man = Vec::new();
    clap_mangen::Man::new(Cli::command()).render(&mut man)?;
    let path = dir.join("gantry.1");
    std::fs::write(&path, man).with_context(|| format!("cannot write {}", path.display()))?;
    outln!("{}", path.display());
    Ok(())
}

fn print_inbox(i: &InboxInfo, init: bool) {
    let path = esc(&i.path.display().to_string()).into_owned();
    match (i.watched, init) {
        (true, true) => outln!("Your drop folder is ready: {path}"),
        (true, false) => outln!("Your drop folder: {path} (the engine watches it)"),
        (false, _) => outln!("Your drop folder: {path} (NOT watched: {})", esc(i.problem.as_deref().unwrap_or("see the engine's log"))),
    }
    if !i.watched {
        return;
    }
    outln!("Drop a job spec (.yaml or .toml) into it to queue it as you. Each file moves to accepted/ (named");
    outln!("<job id>-<file>) or to rejected/ with <file>.error.txt saying why. Write files elsewhere and move");
    outln!("them in, or save them in place: only finished files are read.");
    if !i.lab_templates.is_empty() {
        outln!("Lab templates: {}", i.lab_templates.iter().map(|t| esc(t).into_owned()).collect::<Vec<_>>().join(", "));
        let t = esc(&i.lab_templates[0]).into_owned();
        outln!("To run one on a config file: `mkdir {path}/{t}`, then drop the config file into that folder.");
    }
}

fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    outln!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

async fn run(cli: Cli) -> Result<std::process::ExitCode> {
    let (socket, found_by) = gantry_core::client::locate(cli.state_dir.clone());
    let remote = match (&cli.host, &cli.cmd) {
        (Some(_), Cmd::Daemon { .. } | Cmd::Proxy) => bail!("--host (or GANTRY_HOST) is for commands that talk to an engine; `daemon` and `proxy` run on the workstation itself"),
        (Some(h), _) => Some(Target::ssh(h)?),
        (None, _) => None,
    };
    let mut client = Client::to(remote.clone().unwrap_or_else(|| Target::Socket(socket.clone())));
    if let Some(t) = cli.client_timeout {
        client = client.with_timeout(t);
    }
    match &cli.cmd {
        Cmd::Daemon { system, system_root, gpus, inbox, config, reserve_after, stop_grace, retry_backoff, header_timeout, inbox_group, inbox_path, node_agent } => {
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .init();
            if let Some(dir) = node_agent {
                gantry_core::node_agent::run(dir.clone(), gpus.clone(), gantry_core::config::SAMPLE_EVERY, async {
                    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
                    tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} }
                })
                .await
                .context("the node agent stopped")?;
                return Ok(std::process::ExitCode::SUCCESS);
            }
            let mut cfg = Config::new(match system {
                true => {
                    let mut p = Paths::system(system_root);
                    p.inbox = inbox.clone().unwrap_or(p.inbox);
                    p
                }
                false => paths(&cli, inbox.clone()),
            });
            cfg.gpus = gpus.clone();
            // The flags win over the lab config, also after a reload.
            cfg.overrides = Overrides { reserve_after: *reserve_after, stop_grace: *stop_grace, retry_backoff: *retry_backoff };
            match (config, system) {
                (Some(f), _) => cfg.load_lab(f.clone(), false)?,
                // The system engine's file is optional: without it, the defaults.
                (None, true) => cfg.load_lab(gantry_core::config::under(system_root, SYSTEM_CONFIG), true)?,
                (None, false) => {}
            }
            // One non-system engine per machine's GPUs; every client finds the system engine first.
            let _lock = match system {
                true => None,
                false => Some(gantry_core::machine_lock::take(&gantry_core::machine_lock::lock_name(cfg.gpus.as_deref()), &cfg.paths.socket()).await?),
            };
            if let Some(t) = header_timeout {
                cfg.api.header_read_timeout = *t;
            }
            if let Some(p) = inbox_path {
                gantry_core::inbox::users::check_inbox_path(p).map_err(anyhow::Error::msg)?;
                cfg.inbox_path = p.clone();
            }
            cfg.inbox_group = inbox_group.clone().or(cfg.inbox_group);
            gantry_core::daemon::run(cfg, async {
                let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
                tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} }
            })
            .await
            .context("the engine stopped")?;
        }
        Cmd::Generate { dir } => generate(dir)?,
        Cmd::Proxy => gantry_core::client::proxy(&socket).await?,
        Cmd::Submit { files } => return submit(&client, files, cli.json).await,
        Cmd::Run(args) => {
            let (text, file_name) = args.spec_text()?;
            // Remote: this computer's folder means nothing on the workstation (relative mounts are refused there).
            let base_dir = match remote {
                Some(_) => None,
                None => Some(std::env::current_dir().context("cannot read the current directory (relative mounts start from it)")?),
            };
            let s: Submitted = client.post("/v1/jobs", &SubmitRequest { text, file_name, base_dir }).await.map_err(|e| match e {
                // The line numbers point into text the user never saw: name the field only.
                ClientError::Api { spec_error: Some(se), .. } => anyhow::anyhow!("{}", gantry_core::spec::SpecError { line: None, column: None, ..se }),
                e => e.into(),
            })?;
            if cli.json {
                print_json(&s)?;
            } else {
                outln!("queued as job {}", s.job_id);
            }
        }
        Cmd::Ls => {
            let q: Vec<QueueEntryView> = client.get("/v1/jobs").await?;
            if cli.json {
                print_json(&q)?;
            } else {
                print_queue(&q);
            }
        }
        Cmd::Show { id } => {
            let d: JobDetailView = client.get(&format!("/v1/jobs/{id}")).await?;
            if cli.json {
                print_json(&d)?;
            } else {
                print_detail(&d);
            }
        }
        Cmd::Logs { id, follow } => {
            // Raw for the job's owner (progress bars, colours); escaped when someone else (root)
            // reads it on a terminal, since the owner wrote it.
            let mut safe = (std::io::IsTerminal::is_terminal(&std::io::stdout()) && !own_job(&client, *id).await?).then(TermSafe::default);
            let mut show = |chunk: &[u8]| match safe.as_mut() {
                Some(s) => write_out(s.feed(chunk).as_bytes()),
                None => write_out(chunk),
            };
            if *follow {
                client
                    .stream(&format!("/v1/jobs/{id}/logs?follow=true"), |chunk| {
                        show(chunk);
                        true
                    })
                    .await?;
            } else {
                show(&client.raw(&format!("/v1/jobs/{id}/logs")).await?);
            }
        }
        Cmd::Rerun { id } => {
            let s: Submitted = client.post(&format!("/v1/jobs/{id}/rerun"), &()).await?;
            if cli.json {
                print_json(&s)?;
            } else {
                outln!("job {id} queued again as job {}", s.job_id);
            }
        }
        Cmd::Cancel { id } => {
            let before: JobState = client.post(&format!("/v1/jobs/{id}/cancel"), &()).await?;
            match before {
                JobState::Queued => outln!("job {id} cancelled"),
                JobState::Starting | JobState::Running => outln!("job {id} is being stopped (SIGTERM, then SIGKILL after the grace period)"),
                s => outln!("job {id} had already ended ({})", s.as_str()),
            }
        }
        Cmd::Priority { id, priority } => {
            let ok: bool = client.post(&format!("/v1/jobs/{id}/priority"), &PriorityRequest { priority: *priority }).await?;
            if !ok {
                bail!("job {id} is no longer queued; only queued jobs change priority");
            }
            outln!("job {id} priority set to {priority}");
        }
        Cmd::Hold { id } | Cmd::Release { id } => {
            let held = matches!(cli.cmd, Cmd::Hold { .. });
            let ok: bool = client.post(&format!("/v1/jobs/{id}/{}", if held { "hold" } else { "release" }), &()).await?;
            match (ok, held) {
                (true, true) => outln!("job {id} is held: it stays queued until `gantry release {id}`"),
                (true, false) => outln!("job {id} released: it starts when the scheduler places it"),
                (false, true) => bail!("job {id} is not waiting in the queue, or is held already; only queued jobs can be held"),
                (false, false) => bail!("job {id} is not held (or no longer queued); nothing to release"),
            }
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
        Cmd::Config { cmd: ConfigCmd::Check { file } } => {
            let root = std::env::var_os("GANTRY_SYSTEM_ROOT").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/"));
            let file = file.clone().unwrap_or_else(|| gantry_core::config::under(&root, SYSTEM_CONFIG));
            // Explicitly named or not, checking a file that is not there is a mistake worth saying.
            match LabConfig::load(&file, false) {
                Ok(lab) => {
                    if cli.json {
                        print_json(&serde_json::json!({"file": file, "ok": true, "problems": []}))?;
                    } else {
                        outln!("OK: {}", esc(&file.display().to_string()));
                        if let Some(g) = &lab.gpus {
                            outln!("note: `gpus` ({}) is checked against the machine's GPUs when the engine starts", g.gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(", "));
                        }
                    }
                }
                Err(e) => {
                    if cli.json {
                        print_json(&serde_json::json!({"file": file, "ok": false, "problems": e.problems}))?;
                    } else {
                        for p in &e.problems {
                            eprintln!("{}", esc(&p.to_string()));
                        }
                    }
                    return Ok(std::process::ExitCode::FAILURE);
                }
            }
        }
        Cmd::Usage { since } => {
            let r = client.usage(parse_since(since)?).await?;
            if cli.json {
                print_json(&r)?;
            } else {
                print_usage(&r);
            }
        }
        Cmd::Sim { trace, gpus, policy, load, runtimes, reserve_after, reserve_factor, wide_reserve_factor, narrow, drain_limit, share_drains, order, from_fraction, packing, fair_share, estimates, seeds, protocol, nodes } => {
            let mut sched = gantry_core::scheduler::Config { reserve_after_ms: reserve_after.as_millis() as i64, reserve_factor: *reserve_factor, ..Default::default() };
            if let Some(w) = wide_reserve_factor {
                sched.wide_reserve_factor = *w;
            }
            sched.share_drains = share_drains == "on";
            sched.hrrn = order == "hrrn";
            sched.drain_limit_factor = match drain_limit.as_str() {
                "none" => None,
                f => Some(f.parse().with_context(|| format!("--drain-limit {f:?}: a number or none"))?),
            };
            sched.age_narrow = match narrow.as_str() {
                "age" => true,
                "reserve" => false,
                n => bail!("unknown --narrow {n:?}: age or reserve"),
            };
            sched.packing = match packing.as_str() {
                "fgd" => gantry_core::scheduler::Packing::Fgd,
                "best-fit" => gantry_core::scheduler::Packing::BestFit,
                "worst-fit" => gantry_core::scheduler::Packing::WorstFit,
                p => bail!("unknown packing {p:?}: fgd, best-fit or worst-fit"),
            };
            let learn = match estimates.as_str() {
                "learned" => true,
                "none" => false,
                e => bail!("unknown estimates {e:?}: learned or none"),
            };
            if protocol == "fgd" {
                let r = sim_fgd(trace, gpus, *nodes, sched, (*seeds).max(1))?;
                if cli.json {
                    print_json(&r)?;
                } else {
                    print_fgd(&r);
                }
            } else if protocol != "queue" {
                bail!("unknown protocol {protocol:?}: queue or fgd");
            } else if *seeds > 1 {
                let runs = sim_seeds(trace, gpus, policy, *load, *runtimes, sched, *fair_share, learn, *seeds, *from_fraction)?;
                if cli.json {
                    print_json(&runs)?;
                } else {
                    print_seeds(&runs, *seeds);
                }
            } else {
                let reports = sim(trace, gpus, policy, *load, *runtimes, sched, *fair_share, learn, 0, *from_fraction)?;
                if cli.json {
                    print_json(&reports)?;
                } else {
                    print_sim(&reports);
                }
            }
        }
        Cmd::Inbox { action } => {
            let mut info: InboxInfo = client.get("/v1/inbox").await?;
            let init = matches!(action, Some(InboxAction::Init));
            if let (true, Some(Target::Ssh { host, .. })) = (init && info.per_user, &remote) {
                // The folder is made by the user on the workstation, not on this computer.
                bail!("your drop folder is on {host}: run `ssh {host} gantry inbox init` there");
            }
            if init && info.per_user {
                // Made by the user, as the user: the engine only checks it and watches it.
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&info.path)
                    .with_context(|| format!("cannot create your drop folder {}", info.path.display()))?;
                info = client.post("/v1/inbox", &()).await.context("the engine does not watch your drop folder")?;
            }
            if cli.json {
                print_json(&info)?;
            } else {
                print_inbox(&info, init);
            }
            if init && !info.watched {
                return Ok(std::process::ExitCode::FAILURE);
            }
        }
        Cmd::Status => {
            let s: StatusInfo = client.get("/v1/status").await?;
            if cli.json {
                #[derive(serde::Serialize)]
                struct Located<'a> {
                    #[serde(flatten)]
                    status: &'a StatusInfo,
                    found_by: Option<FoundBy>,
                    socket: Option<&'a Path>,
                    host: Option<&'a str>,
                }
                let located = match &cli.host {
                    Some(h) => Located { status: &s, found_by: None, socket: None, host: Some(h) },
                    None => Located { status: &s, found_by: Some(found_by), socket: Some(&socket), host: None },
                };
                print_json(&located)?;
            } else {
                let at = esc(&socket.display().to_string()).into_owned();
                outln!(
                    "{}",
                    match (&cli.host, found_by) {
                        (Some(h), _) => format!("remote: {} ({}, through ssh)", esc(h), if s.system { "system engine" } else { "an engine of your own there" }),
                        (None, FoundBy::System) => format!("system engine at {at}"),
                        (None, FoundBy::StateDir) => format!("engine from --state-dir at {at}"),
                        (None, FoundBy::User) => format!("your own engine at {at}"),
                    }
                );
                outln!("engine pid {} (v{}), state in {}", s.pid, s.version, esc(&s.state_dir.display().to_string()));
                outln!("drop folder: {}", esc(&s.inbox.display().to_string()));
                outln!("{} GPU(s), {}", s.gpu_count, esc(&backend_label(s.gpu_backend, s.gpu_note.as_deref(), s.gpu_library.as_deref())));
                if !s.reserved_gpus.is_empty() {
                    outln!("GPU {} kept for interactive use (lab config `gpus`): Gantry never runs jobs there", s.reserved_gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(","));
                }
                outln!("lab config: {}", s.config_file.as_ref().map(|f| esc(&f.display().to_string()).into_owned()).unwrap_or_else(|| "none (built-in defaults)".into()));
                if let Some(p) = s.store_problem {
                    outln!("ERROR: {}", esc(&p));
                }
                if let Some(p) = s.backend_problem {
                    outln!("WARNING: {}", esc(&p));
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
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Whether the caller owns job `id` (root reading someone's log does not).
async fn own_job(client: &Client, id: i64) -> Result<bool> {
    let me: WhoAmI = client.get("/v1/whoami").await?;
    let d: JobDetailView = client.get(&format!("/v1/jobs/{id}")).await?;
    Ok(me.uid == d.job.owner_uid)
}

/// Job output made safe for a terminal: control characters other than newline and tab are escaped.
/// A UTF-8 character split between chunks is held back until its end arrives.
#[derive(Default)]
struct TermSafe {
    held: Vec<u8>,
}

impl TermSafe {
    fn feed(&mut self, chunk: &[u8]) -> String {
        self.held.extend_from_slice(chunk);
        let keep = incomplete_utf8_tail(&self.held);
        let tail = self.held.split_off(self.held.len() - keep);
        let text = escape(&String::from_utf8_lossy(&self.held), "\n\t").into_owned();
        self.held = tail;
        text
    }
}

/// How many bytes at the end of `b` start a UTF-8 character that is not complete yet.
fn incomplete_utf8_tail(b: &[u8]) -> usize {
    for back in 1..=b.len().min(3) {
        let c = b[b.len() - back];
        if c >= 0xC0 {
            let len = if c >= 0xF0 { 4 } else if c >= 0xE0 { 3 } else { 2 };
            return if len > back { back } else { 0 };
        }
        if c < 0x80 {
            return 0;
        }
    }
    0
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
                        [one] => outln!("{}: queued as job {one}", esc(&f.display().to_string())),
                        many => outln!("{}: queued {} jobs: {}", esc(&f.display().to_string()), many.len(), many.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")),
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
                    eprintln!("{}: {}", esc(&f.display().to_string()), escape(&format!("{e:#}"), "\n"));
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

fn print_queue(q: &[QueueEntryView]) {
    if q.is_empty() {
        outln!("no running or queued jobs");
        return;
    }
    outln!("{:>5}  {:<9} {:<10} {:<24} {:<10} {:<8} STATUS", "ID", "STATE", "OWNER", "NAME", "GPUS", "AGE");
    for e in q {
        let j = &e.job;
        let status = match j.state {
            JobState::Queued => {
                let conf = e.eta_confidence.as_deref().map(|c| format!(", {}", esc(c))).unwrap_or_default();
                let eta = e.estimated_start.map(|t| format!(" (starts ~{}{conf})", if t <= now_ms() { "now".into() } else { format!("in {}", human_delta(t - now_ms())) })).unwrap_or_default();
                format!("#{} {}{eta}", e.position.unwrap_or(0), esc(e.reason.as_deref().unwrap_or_default()))
            }
            // Submitted to Slurm and waiting there: Slurm's reason.
            _ if e.reason.is_some() => esc(e.reason.as_deref().unwrap_or_default()).into_owned(),
            _ => format!("on GPU {}", e.gpus_assigned.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(",")),
        };
        outln!("{:>5}  {:<9} {:<10} {:<24} {:<10} {:<8} {}", j.id, j.state.as_str(), esc(&j.owner), trunc(&esc(&j.name), 24), ask(j.gpus, j.gpu_memory), ago(j.submitted_at), status);
    }
}

fn trunc(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_string() } else { format!("{}…", s.chars().take(n - 1).collect::<String>()) }
}

fn print_detail(d: &JobDetailView) {
    let j = &d.job;
    outln!("job {}  {}  ({})", j.id, esc(&j.name), j.state.as_str());
    outln!("owner:     {} (uid {})", esc(&j.owner), j.owner_uid);
    outln!("image:     {}", esc(&j.image));
    print_spec(j);
    outln!("gpus:      {}   priority {}   retries {}", ask(j.gpus, j.gpu_memory), j.priority, j.retries);
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
            "attempt {}: GPU [{}] {} -> {} {} {}",
            a.n,
            a.gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(","),
            time(Some(a.started_at)),
            time(a.ended_at),
            a.reason.map(|r| r.as_str()).unwrap_or("running"),
            a.exit_code.map(|c| format!("(code {c})")).unwrap_or_default()
        );
    }
    outln!("events:");
    for e in &d.events {
        outln!("  {}  {} -> {}  {}", time(Some(e.at)), esc(e.from.as_deref().unwrap_or("-")), esc(&e.to), esc(e.message.as_deref().unwrap_or("")));
    }
}

/// Command, workdir, environment and mounts: the owner's and root's to see.
fn print_spec(j: &JobView) {
    let Some(v) = &j.job else {
        outln!("spec:      hidden: only {} and root see its command, environment, mounts and output", esc(&j.owner));
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
        outln!("{:<11}{} -> {}{}", if i == 0 { "mounts:" } else { "" }, esc(&m.host), esc(&m.container), if m.read_only { " (read-only)" } else { "" });
    }
}

fn backend_label(kind: BackendKind, note: Option<&str>, library: Option<&str>) -> String {
    match (kind, note, library) {
        (BackendKind::Nvml, _, Some(lib)) => format!("NVML from {lib} (GANTRY_NVML_LIB; not the driver's library, e.g. a test double)"),
        (BackendKind::Nvml, _, None) => "NVML (real GPUs)".into(),
        (BackendKind::Simulated, Some(n), _) => format!("SIMULATED GPUs (NVML unavailable: {n})"),
        (BackendKind::Simulated, None, _) => "SIMULATED GPUs".into(),
    }
}

fn print_gpus(g: &GpuStatus) {
    if g.backend == BackendKind::Simulated || g.library.is_some() {
        outln!("*** {} ***", esc(&backend_label(g.backend, g.note.as_deref(), g.library.as_deref())));
    }
    outln!("{:>3}  {:<22} {:>6} {:>21} {:>6} {:>7}  HELD BY", "GPU", "NAME", "UTIL", "MEMORY", "TEMP", "POWER");
    for s in &g.gpus {
        let users: Vec<&GpuUser> = g.users.iter().filter(|u| u.gpu == s.index).collect();
        let jobs: Vec<String> = users.iter().filter_map(|u| u.job_id).map(|j| format!("job {j}")).collect();
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
            outln!("       MIG instance {} of GPU {} ({})", esc(&s.uuid), p.index, esc(&p.name));
        }
        for u in users {
            outln!("       {}", gpu_user_line(u));
        }
    }
    // Topology, closest links first: "NVLink: 0-1, 2-3; same PCIe switch: 0-2".
    let mut links: Vec<(gantry_core::gpu::Link, u32, u32)> =
        g.gpus.iter().flat_map(|s| s.links.iter().filter(|l| l.peer > s.index).map(|l| (l.link, s.index, l.peer))).collect();
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

fn print_usage(r: &UsageReport) {
    outln!("since {} (fair share: GPU-hours halve every {})", time(Some(r.since_ms)), human_delta(r.fair_share_half_life_ms));
    if r.users.is_empty() {
        outln!("no use in this window");
        return;
    }
    outln!("{:<16} {:>10} {:>6} {:>12} {:>11}", "USER", "GPU-HOURS", "JOBS", "MEAN WAIT", "FAIR SHARE");
    for u in &r.users {
        outln!(
            "{:<16} {:>10.2} {:>6} {:>12} {:>11.2}",
            trunc(&esc(&u.user), 16),
            u.gpu_hours,
            u.jobs_finished,
            u.mean_wait_ms.map(human_delta).unwrap_or_else(|| "-".into()),
            u.fair_share_usage
        );
    }
}

/// "job 12 train (alice), 3.0 GiB" or "outside Gantry (pid 1234, user bob, command python x.py) in
/// container bob-nb, 3.0 GiB". Every field is escaped: process commands are anyone's text.
fn gpu_user_line(u: &GpuUser) -> String {
    let mut line = match u.job_id {
        Some(j) => format!("job {j} {} ({})", esc(u.job_name.as_deref().unwrap_or("?")), esc(u.user.as_deref().unwrap_or("?"))),
        None => {
            let mut what = vec![];
            if let Some(p) = u.pid {
                what.push(format!("pid {p}"));
                what.push(format!("user {}", esc(u.user.as_deref().unwrap_or("?"))));
                what.push(format!("command {}", esc(u.command.as_deref().unwrap_or("?"))));
            }
            let mut s = if what.is_empty() { "outside Gantry".to_string() } else { format!("outside Gantry ({})", what.join(", ")) };
            if let Some(c) = &u.container {
                s.push_str(&format!(" in container {}", esc(c)));
            }
            s
        }
    };
    if let Some(m) = u.used_memory {
        line.push_str(&format!(", {}", format_bytes(m)));
    }
    line
}

fn print_history(rows: &[HistoryRow]) {
    if rows.is_empty() {
        outln!("no completed runs match");
        return;
    }
    outln!("{:>5}  {:<10} {:<10} {:<24} {:<5} {:<8} {:<20} {:>9}", "ID", "STATUS", "OWNER", "NAME", "CODE", "GPUS", "FINISHED", "DURATION");
    for r in rows {
        let dur = match (r.started_at, r.finished_at) {
            (Some(s), Some(f)) => humantime::format_duration(Duration::from_secs(((f - s) / 1000).max(0) as u64)).to_string(),
            _ => "-".into(),
        };
        outln!(
            "{:>5}  {:<10} {:<10} {:<24} {:<5} {:<8} {:<20} {:>9}",
            r.id,
            r.status.as_str(),
            esc(&r.owner),
            trunc(&esc(&r.name), 24),
            r.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
            r.gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(","),
            time(r.finished_at),
            dur
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn sim(
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
        vec![Policy::parse(policy).with_context(|| format!("unknown policy {policy:?}: serial, fifo, greedy, gantry or all"))?]
    };
    let mut out = vec![];
    for p in policies {
        let mut cfg = SimConfig { gpus: n, gpu_memory: mem, policy: p, declared_runtimes: false, scheduler: sched.clone(), fair_share_half_life_s: fair_share.map(|d| d.as_secs_f64()), learn_runtimes: learn };
        out.push(sim::simulate(&t, &cfg));
        if p == Policy::Gantry && (runtimes || policy == "all") {
            cfg.declared_runtimes = true;
            out.push(sim::simulate(&t, &cfg));
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
) -> Result<Vec<SeedRow>> {
    let mut rows: Vec<SeedRow> = vec![];
    for seed in 0..seeds {
        let mut reports = sim(trace, gpus, policy, load, runtimes, sched.clone(), fair_share, learn, seed, from_fraction)?;
        // Waits are reported relative to strict FIFO on the same arrivals.
        let fifo = match reports.iter().find(|r| r.policy == "fifo") {
            Some(f) => f.mean_wait_s,
            None => sim(trace, gpus, "fifo", load, false, sched.clone(), fair_share, learn, seed, from_fraction)?[0].mean_wait_s,
        };
        for r in reports.drain(..) {
            let row = match rows.iter_mut().position(|x| x.policy == r.policy) {
                Some(i) => &mut rows[i],
                None => {
                    rows.push(SeedRow { policy: r.policy.clone(), makespan_ratio: vec![], alloc_share_while_waiting: vec![], wait_over_fifo: vec![], big_over_one: vec![], mean_wait_by_user: vec![] });
                    rows.last_mut().unwrap()
                }
            };
            row.makespan_ratio.push(r.makespan_ratio);
            row.alloc_share_while_waiting.push(r.alloc_share_while_waiting);
            row.wait_over_fifo.push(if fifo > 0.0 { r.mean_wait_s / fifo } else { f64::NAN });
            if let Some(b) = r.big_over_one() {
                row.big_over_one.push(b);
            }
            row.mean_wait_by_user.push(r.mean_wait_by_user.clone());
        }
    }
    Ok(rows)
}

fn print_seeds(rows: &[SeedRow], seeds: u64) {
    use gantry_core::sim::mean_ci;
    outln!("{seeds} seeds (arrival perturbations; seed 0 = as recorded); mean ± 95% CI");
    outln!("{:<18} {:>16} {:>16} {:>16} {:>16}", "policy", "makespan/LB", "alloc/wait %", "wait/fifo", "wait 4+/1 GPU");
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
            "{:<18} {:>16} {:>16} {:>16} {:>16}",
            r.policy,
            f(&r.makespan_ratio, 1.0, 3),
            f(&r.alloc_share_while_waiting, 100.0, 1),
            f(&r.wait_over_fifo, 1.0, 3),
            f(&r.big_over_one, 1.0, 2)
        );
    }
    let h = |s: f64| humantime::format_duration(Duration::from_secs(s as u64)).to_string().split(' ').take(2).collect::<Vec<_>>().join(" ");
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
            outln!("{:<18} mean wait: {}", r.policy, w.join(", "));
        }
    }
}

fn sim_fgd(trace: &Path, gpus: &str, nodes: u32, sched: gantry_core::scheduler::Config, seeds: u64) -> Result<Vec<gantry_core::sim::FgdReport>> {
    let b = gantry_core::gpu::SimulatedBackend::from_spec(gpus)?;
    let (n, mem) = b.shape();
    let t = gantry_core::sim::load_trace(trace, n)?;
    let mut out = vec![];
    for packing in [gantry_core::scheduler::Packing::Fgd, gantry_core::scheduler::Packing::BestFit, gantry_core::scheduler::Packing::WorstFit] {
        let cfg = gantry_core::scheduler::Config { packing, ..sched.clone() };
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
    outln!("{:<12} {:>22} {:>16}", "packing", "GPU allocation ratio %", "failed tasks");
    for r in rs {
        let (m, c) = mean_ci(&r.alloc_ratio);
        let (fm, fc) = mean_ci(&r.failed);
        outln!("{:<12} {:>22} {:>16}", r.packing, format!("{:.1} ± {:.1}", m * 100.0, c * 100.0), format!("{fm:.1} ± {fc:.1}"));
    }
}

fn print_sim(reports: &[gantry_core::sim::Report]) {
    let Some(r0) = reports.first() else { return };
    outln!("{} jobs on {} GPUs ({} CPU-only and {} too-large tasks dropped)", r0.jobs, r0.gpus, r0.dropped_cpu_only, r0.dropped_too_big);
    outln!("{:<18} {:>12} {:>9} {:>11} {:>12} {:>12} {:>14}", "policy", "makespan", "xLB", "alloc/wait", "mean wait", "p95 wait", "wait 4+/1 GPU");
    let h = |s: f64| humantime::format_duration(Duration::from_secs(s as u64)).to_string().split(' ').take(2).collect::<Vec<_>>().join(" ");
    for r in reports {
        let w1 = r.mean_wait_by_gpus.get(&1).copied().unwrap_or(0.0);
        let big: Vec<f64> = r.mean_wait_by_gpus.iter().filter(|(g, _)| **g >= 4).map(|(_, w)| *w).collect();
        let ratio = if big.is_empty() || w1 == 0.0 { "-".to_string() } else { format!("{:.2}", big.iter().sum::<f64>() / big.len() as f64 / w1) };
        outln!(
            "{:<18} {:>12} {:>9.3} {:>10.1}% {:>12} {:>12} {:>14}",
            r.policy, h(r.makespan_s), r.makespan_ratio, 100.0 * r.alloc_share_while_waiting, h(r.mean_wait_s), h(r.p95_wait_s), ratio
        );
    }
    outln!("lower bound: {}", h(r0.lower_bound_s));
    if r0.user_share.len() > 1 {
        for r in reports {
            let shares: Vec<String> = r.user_share.iter().map(|(u, s)| format!("{} {:.1}%", esc(u), s * 100.0)).collect();
            let waits: Vec<String> = r.mean_wait_by_user.iter().map(|(u, w)| format!("{} {}", esc(u), h(*w))).collect();
            outln!("{:<18} GPU share under contention: {}; mean wait: {}", r.policy, shares.join(", "), waits.join(", "));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_print_as_visible_escapes() {
        assert_eq!(esc("plain name-1"), "plain name-1");
        assert_eq!(esc("\x1b[2Jx\r\n\t\u{9b}\u{202e}"), "\\u{1b}[2Jx\\r\\n\\t\\u{9b}\\u{202e}");
        assert_eq!(escape("a\nb\x07", "\n"), "a\nb\\u{7}");
    }

    #[test]
    fn job_output_is_escaped_across_chunk_boundaries() {
        let mut t = TermSafe::default();
        let text = "é\x1b]0;owned\x07 ok\n".as_bytes();
        let out: String = text.chunks(1).map(|c| t.feed(c)).collect();
        assert_eq!(out, "é\\u{1b}]0;owned\\u{7} ok\n");
        assert_eq!(incomplete_utf8_tail(&[b'a', 0xE2, 0x82]), 2);
        assert_eq!(incomplete_utf8_tail(&[0xE2, 0x82, 0xAC]), 0);
    }
}
