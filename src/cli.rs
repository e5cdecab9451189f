//! The command line: every command, flag and help text (`gantry generate` writes completions and
//! the man page from these definitions).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "gantry",
    version,
    about = "A fair, self-service GPU job queue for a shared workstation"
)]
pub struct Cli {
    /// Keep the database, logs and socket under DIR (default: $XDG_STATE_HOME/gantry).
    #[arg(long, global = true, env = "GANTRY_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Use the engine of a workstation reached with ssh (`user@host` or a ~/.ssh/config Host): runs
    /// `ssh HOST gantry proxy`, so you act there as the ssh user.
    #[arg(long, global = true, env = "GANTRY_HOST", value_name = "HOST")]
    pub host: Option<String>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub json: bool,
    /// How long to wait for the engine's answer (tests shorten it).
    #[arg(long, global = true, hide = true, env = "GANTRY_CLIENT_TIMEOUT", value_parser = humantime::parse_duration)]
    pub client_timeout: Option<Duration>,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Run the engine (one per machine).
    Daemon(DaemonArgs),
    /// Queue job spec files (YAML or TOML).
    Submit {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Queue nothing: check each file as a submit would (as you, the lab's limits) and say
        /// which GPUs its jobs would get now, or why they would wait and until about when.
        #[arg(long)]
        dry_run: bool,
        /// Start no earlier than this, in place of the files' `begin:` ("22:00", "tomorrow 08:00", "+2h";
        /// the workstation's local time). Until then the jobs wait and hold nothing.
        #[arg(long, value_name = "TIME")]
        begin: Option<String>,
    },
    /// Queue a job from flags, without writing a file: `gantry run --gpus 1 --image IMG -- python train.py`.
    Run(RunArgs),
    /// An interactive session: queue a shell in a container (GPUs, a time limit), wait for it,
    /// and attach your terminal to it. Ctrl-P Ctrl-Q detaches; `gantry attach ID` comes back.
    Shell(ShellArgs),
    /// Attach your terminal to one of your running sessions (`gantry shell`).
    Attach { id: i64 },
    /// A Jupyter notebook session: `jupyter lab` in a container with GPUs, and the URL (with its
    /// token) to open it from here.
    Notebook(NotebookArgs),
    /// Print a URL on this computer that reaches one of your job's `ports` (only you can use it).
    /// With --host, forwards it through ssh until Ctrl-C.
    Open {
        id: i64,
        /// Which of the job's ports (default: its first).
        port: Option<u16>,
    },
    /// Running and queued jobs, and why each queued job waits: every running job, the next queued
    /// ones in scheduling order and your own (up to `--limit` of each).
    Ls {
        /// Queued jobs shown: the next N to start, and your first N.
        #[arg(short = 'n', long, default_value_t = gantry_core::defaults::LS_QUEUED_SHOWN)]
        limit: usize,
        /// Every queued job (a deep queue is long).
        #[arg(long)]
        all: bool,
    },
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
        /// Add a column: each run's last value of this metric (your runs; everyone's for admins).
        #[arg(long)]
        metric: Option<String>,
    },
    /// Runs side by side: params, each metric's last value, state, duration, GPU-hours; best first.
    /// `gantry compare 12 13 15`, `gantry compare sweep --sort val/loss`.
    Compare {
        /// Job ids, or one name: a sweep's runs (`name[...]`) or every run of that name.
        #[arg(required = true)]
        runs: Vec<String>,
        /// The metric rows are sorted by, best first (default: the first metric every run logged).
        #[arg(long)]
        sort: Option<String>,
        /// Lower is better for --sort, whatever its name says (names like loss, error, perplexity
        /// already are).
        #[arg(long)]
        min: bool,
        /// One row per run as CSV (every param, each metric's last value).
        #[arg(long, conflicts_with = "json")]
        csv: bool,
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
        /// Print GPU-hours per user per day (`day,user,gpu_hours`, UTC days) as CSV, for spreadsheets.
        #[arg(long, conflicts_with = "json")]
        csv: bool,
    },
    /// Book GPUs for a time: `gantry book --gpus 2 --at "tomorrow 14:00" --for 4h --note demo`;
    /// `gantry book cancel ID`. See `gantry bookings`.
    #[command(args_conflicts_with_subcommands = true)]
    Book {
        #[command(subcommand)]
        action: Option<BookAction>,
        /// How many GPUs.
        #[arg(long, default_value_t = 1)]
        gpus: u32,
        /// Only GPUs whose name contains this (e.g. A100), as a job's `gpu_type`.
        #[arg(long)]
        gpu_type: Option<String>,
        /// When it starts, in local time: "14:00" (today, or tomorrow once past), "tomorrow 14:00",
        /// "2026-12-03 09:30", or "+2h" (from now, rounded up to the lab's slot).
        #[arg(long)]
        at: Option<String>,
        /// How long: "4h", "90m" (a whole number of the lab's slots).
        #[arg(long = "for", value_parser = humantime::parse_duration)]
        length: Option<std::time::Duration>,
        /// A note for yourself (others see the booking's owner and time, not the note).
        #[arg(long)]
        note: Option<String>,
    },
    /// GPU bookings: everyone's (owner and time; notes are the owner's), and the lab's rules.
    Bookings {
        /// Also the ones that ended, were cancelled or released.
        #[arg(long)]
        all: bool,
    },
    /// Be told when your jobs end: email or a webhook (Slack, Mattermost, your own), kept by the engine.
    Notify {
        #[command(subcommand)]
        action: NotifyAction,
    },
    /// Engine status.
    Status,
    /// Join stdin/stdout to this machine's engine: what `gantry --host` and the app run through ssh.
    Proxy,
    /// Write shell completions (bash, zsh, fish) and the man page into DIR (used by scripts/package.sh);
    /// with --reference, the guide's reference pages (docs/book/src/reference).
    #[command(hide = true)]
    Generate {
        dir: PathBuf,
        /// The guide's reference pages (commands, job spec, lab config keys) instead.
        #[arg(long)]
        reference: bool,
    },
    /// Your drop folder: where it is, whether the engine watches it, and the lab's templates.
    Inbox {
        #[command(subcommand)]
        action: Option<InboxAction>,
    },
    /// Replay a workload trace through the scheduler on a virtual clock (no Docker, no sleeping).
    Sim(SimArgs),
    /// Serve the Model Context Protocol on stdin/stdout, for coding agents (Claude Code, Codex,
    /// Cursor): tools to list, preview, submit, triage and control your jobs, acting as you (the
    /// same engine and rules as this CLI, `--host` included).
    Mcp,
}

#[derive(Subcommand)]
pub enum ConfigCmd {
    /// Check a lab config: prints OK, or each problem with its line and column (exit status 1).
    Check {
        /// Default: the file the engine would read ($GANTRY_CONFIG, else /etc/gantry/config.toml).
        #[arg(env = "GANTRY_CONFIG")]
        file: Option<PathBuf>,
    },
}

/// `gantry run`: the fields of a job spec as flags; the engine checks them as if written in a file.
#[derive(clap::Args)]
pub struct RunArgs {
    /// Docker image. Left out: this machine's own folders and your home (`image: host`), with
    /// this directory, PATH and an active conda env or venv carried over.
    #[arg(long)]
    pub image: Option<String>,
    /// Number of GPUs (0 for a CPU-only job).
    #[arg(long, default_value_t = 1)]
    pub gpus: i64,
    /// GPU memory per GPU (`20GiB`): share GPUs instead of taking whole ones.
    #[arg(long, value_name = "SIZE")]
    pub mem: Option<String>,
    /// Only GPUs whose name contains this, any case (`H100`); `gantry gpus` lists the names.
    #[arg(long, value_name = "NAME")]
    pub gpu_type: Option<String>,
    /// Only GPUs with at least this much memory in all (`40GiB`).
    #[arg(long, value_name = "SIZE")]
    pub min_gpu_memory: Option<String>,
    /// CPUs the job may use (`8`, `0.5`). Default: the lab's share per GPU.
    #[arg(long)]
    pub cpus: Option<f64>,
    /// RAM the job may use (`64GiB`); not GPU memory (that is `--mem`). Default: the lab's share per GPU.
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// Size of /dev/shm (`16GiB`). Default: half the job's memory limit.
    #[arg(long, value_name = "SIZE")]
    pub shm_size: Option<String>,
    /// Job name (default: the program's name).
    #[arg(long)]
    pub name: Option<String>,
    /// Higher runs first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,
    /// Wall-clock limit (`24h`, `90m`).
    #[arg(long)]
    pub timeout: Option<String>,
    /// Environment variable for the job (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Bind mount `host:container[:ro]` (repeatable); relative host paths are from here.
    #[arg(long = "mount", value_name = "HOST:CONTAINER[:ro]")]
    pub mounts: Vec<String>,
    /// Working directory inside the container.
    #[arg(long)]
    pub workdir: Option<String>,
    /// A port the job serves inside its container (repeatable); `gantry open ID` reaches it.
    #[arg(long = "port", value_name = "PORT")]
    pub ports: Vec<u16>,
    /// Start no earlier than this, in the workstation's local time: "22:00" (today, or tomorrow once
    /// past), "tomorrow 08:00", "2026-12-03 09:30", or "+2h". Until then it waits and holds nothing.
    #[arg(long, value_name = "TIME")]
    pub begin: Option<String>,
    /// Queue nothing: check the job as a submit would and say which GPUs it would get now, or why it
    /// would wait and until about when.
    #[arg(long)]
    pub dry_run: bool,
    /// Run this string with `/bin/sh -c` instead of a command after `--`.
    #[arg(long, conflicts_with = "command")]
    pub shell: Option<String>,
    /// The program and its arguments, run as is (no shell). Default: the image's CMD.
    /// Everything after `--` belongs to the job, so global flags (`--json`) go before it.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `gantry shell`: a session's resources and length (the lab's `[sessions]` bounds them).
#[derive(clap::Args)]
pub struct ShellArgs {
    /// Number of GPUs (0 for none).
    #[arg(long, default_value_t = 1)]
    pub gpus: i64,
    /// GPU memory per GPU (`20GiB`): share a GPU instead of taking a whole one.
    #[arg(long, value_name = "SIZE")]
    pub gpu_memory: Option<String>,
    /// Only GPUs whose name contains this, any case (`H100`).
    #[arg(long, value_name = "NAME")]
    pub gpu_type: Option<String>,
    /// Docker image.
    #[arg(long)]
    pub image: Option<String>,
    /// How long the session may last (`2h`, `90m`) [default: the lab's `[sessions] default_length`].
    #[arg(long = "for", value_name = "DURATION")]
    pub length: Option<String>,
    /// CPUs (`8`, `0.5`). Default: the lab's share per GPU.
    #[arg(long)]
    pub cpus: Option<f64>,
    /// RAM (`64GiB`). Default: the lab's share per GPU.
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// Its name in the queue (default: shell).
    #[arg(long)]
    pub name: Option<String>,
}

/// `gantry notebook`: a session running `jupyter lab`.
#[derive(clap::Args)]
pub struct NotebookArgs {
    #[command(flatten)]
    pub session: ShellArgs,
    /// The port Jupyter listens on inside the container.
    #[arg(long, default_value_t = 8888)]
    pub port: u16,
}

#[derive(Subcommand)]
pub enum BookAction {
    /// Cancel one of your bookings (root may cancel anyone's).
    Cancel { id: i64 },
}

#[derive(Subcommand)]
pub enum NotifyAction {
    /// Add a target: `gantry notify add email ada@lab.org --on failed,timed_out`, or
    /// `gantry notify add webhook https://hooks.slack.com/services/... --on finished,failed`.
    Add {
        /// `email` or `webhook`.
        kind: String,
        /// The email address, or the webhook's URL (its host must be on the lab's list).
        address: String,
        /// Events, comma-separated: started, finished, failed, timed_out, cancelled, preempted,
        /// session_idle, booking_starting, booking_released [default: finished,failed,timed_out]. A job's own
        /// `notify:` list wins over this for that job.
        #[arg(long, value_delimiter = ',')]
        on: Vec<String>,
        /// Only this job (one of yours).
        #[arg(long)]
        job: Option<i64>,
    },
    /// Your targets (and the lab's webhooks).
    Ls,
    /// Remove one of your targets.
    Rm { id: i64 },
    /// Send a test notification to each of your targets.
    Test,
    /// What was sent to you, newest first: delivered, waiting to be tried again, given up.
    Log {
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
}

#[derive(Subcommand)]
pub enum InboxAction {
    /// Create your drop folder (as you) and have the engine watch it, from now on.
    Init,
}

// `gantry daemon`'s flags (its help is the `Cmd::Daemon` doc).
#[derive(clap::Args)]
pub struct DaemonArgs {
    /// Be the machine's engine, for every user: state in /var/lib/gantry, socket /run/gantry/gantry.sock.
    #[arg(long, conflicts_with = "state_dir")]
    pub system: bool,
    /// With --system: put /var/lib/gantry and /run/gantry under DIR (tests).
    #[arg(
        long,
        hide = true,
        env = "GANTRY_SYSTEM_ROOT",
        value_name = "DIR",
        default_value = "/"
    )]
    pub system_root: PathBuf,
    /// Simulated GPUs, e.g. `sim:2x24GiB` (default: NVML when the NVIDIA driver loads).
    #[arg(long)]
    pub gpus: Option<String>,
    /// Drop folder (default: ~/Gantry/inbox, or STATE_DIR/inbox with --state-dir).
    #[arg(long)]
    pub inbox: Option<PathBuf>,
    /// Lab config (limits, admins, retention; see `gantry config check`). Default: /etc/gantry/config.toml
    /// with --system, none otherwise. SIGHUP re-reads it.
    #[arg(long, env = "GANTRY_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A job that cannot start for this long reserves GPUs (no starvation) [default: 30m, or the lab config's].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub reserve_after: Option<Duration>,
    /// Time between SIGTERM and SIGKILL on cancel and timeout [default: 10s, or the lab config's].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub stop_grace: Option<Duration>,
    /// First retry delay, doubling per attempt [default: 10s, or the lab config's].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub retry_backoff: Option<Duration>,
    /// API: close a connection whose request head has not arrived after this long (tests shorten it).
    #[arg(long, hide = true, value_parser = humantime::parse_duration)]
    pub header_timeout: Option<Duration>,
    /// With --system: members of this group get their drop folder made and watched (tests; the
    /// lab config's `[inbox] group`).
    #[arg(long, hide = true, value_name = "GROUP")]
    pub inbox_group: Option<String>,
    /// With --system: each user's drop folder, relative to their home (tests; `[inbox] path`).
    #[arg(long, hide = true, value_name = "PATH")]
    pub inbox_path: Option<PathBuf>,
    /// On a Slurm node: no engine; write this node's GPU samples (NVML, or --gpus) to DIR/<node>.json
    /// every second, for the engine's GPUs view (`[slurm] node_samples`).
    #[arg(long, value_name = "DIR")]
    pub node_agent: Option<PathBuf>,
}

// `gantry sim`'s flags (its help is the `Cmd::Sim` doc).
#[derive(clap::Args)]
pub struct SimArgs {
    /// Gantry CSV (`submit_s,duration_s,gpus,gpu_memory,user,priority`) or Alibaba GPU-cluster CSV.
    #[arg(long)]
    pub trace: PathBuf,
    /// The machine: `8x32GiB`.
    #[arg(long, default_value = "8x32GiB")]
    pub gpus: String,
    /// serial, fifo, greedy, gantry, or all (default: all, side by side).
    #[arg(long, default_value = "all")]
    pub policy: String,
    /// Rescale arrivals so offered GPU demand is L x capacity (1.2 = saturated queue).
    #[arg(long)]
    pub load: Option<f64>,
    /// Give the scheduler the trace's durations as declared runtimes (gantry policy).
    #[arg(long)]
    pub runtimes: bool,
    /// With --runtimes: this share of the users (a fixed hash of the name) declare 1 s whatever
    /// their jobs take; adds a `+liars` row (declarations trusted) and a `+liars+checked` row
    /// (overruns no longer trusted, liars' next declarations give way to the learned p80).
    #[arg(long, default_value_t = 0.0)]
    pub lying_users: f64,
    /// Reservation threshold for the gantry policy.
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    pub reserve_after: Duration,
    /// A job reserves GPUs once it waited this many times the typical wait (gantry policy).
    #[arg(long, default_value_t = 3.0)]
    pub reserve_factor: f64,
    /// Jobs asking for 2+ GPUs reserve once they waited this many times the typical wait.
    #[arg(long)]
    pub wide_reserve_factor: Option<f64>,
    /// A 1-GPU job past the threshold: `age` (goes first) or `reserve` (holds a GPU).
    #[arg(long, default_value = "reserve")]
    pub narrow: String,
    /// Reserve only when the GPUs are expected to drain within F x the longer of the typical wait
    /// and the job's own wait (`none`: always reserve).
    #[arg(long, default_value = "1")]
    pub drain_limit: String,
    /// Wide jobs share one drain (`on`) or each drains for itself (`off`).
    #[arg(long, default_value = "on")]
    pub share_drains: String,
    /// Order (with runtimes): `sjf` (shortest work first) or `hrrn` (highest response ratio).
    #[arg(long, default_value = "sjf")]
    pub order: String,
    /// Replay only the jobs after this fraction of the trace (by arrival), e.g. 0.5 = the second
    /// half: a held-out split.
    #[arg(long, default_value_t = 0.0)]
    pub from_fraction: f64,
    /// Placement of shared (gpu_memory) jobs: fgd (least growth of fragmentation for the recent mix
    /// of request shapes), best-fit or worst-fit.
    #[arg(long, default_value = "fgd")]
    pub packing: String,
    /// Without --runtimes, what the gantry policy knows of runtimes: `learned` (estimates from
    /// the jobs completed so far, as the engine does) or `none`.
    #[arg(long, default_value = "learned")]
    pub estimates: String,
    /// Repeat over N arrival perturbations (seed 0 = the trace as recorded) and report each
    /// figure as mean ± 95% confidence interval.
    #[arg(long, default_value_t = 1)]
    pub seeds: u64,
    /// `queue` (default: arrivals and completions on a virtual clock) or `fgd` (the FGD paper's:
    /// arrivals only in shuffled order, a task that does not fit fails, stop once 130% of the
    /// capacity was requested; reports the GPU allocation ratio).
    #[arg(long, default_value = "queue")]
    pub protocol: String,
    /// With --protocol fgd: how many machines of --gpus (each task goes to the machine where the
    /// packing rule scores it best).
    #[arg(long, default_value_t = 1)]
    pub nodes: u32,
    /// Fair share between users: decay GPU-hours with this half-life (e.g. `24h`); off by default.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub fair_share: Option<Duration>,
    /// Also run the gantry policy with preemption (a `gantry+preempt` row): the same `plan()`
    /// decides whom to preempt, by the lab's rules (`--preempt-rules`, `--min-run`, ...).
    #[arg(long)]
    pub preempt: bool,
    /// With --preempt: jobs checkpoint this often; a preempted job loses the work since its last one.
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    pub checkpoint_every: Duration,
    /// With --preempt: what a restart costs a preempted job (loading the checkpoint, warming up).
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub restart_cost: Duration,
    /// With --preempt: how long a preempted job keeps its GPUs after the checkpoint signal.
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    pub grace: Duration,
    /// With --preempt: the share of jobs that are preemptible (a fixed hash of each job picks them).
    #[arg(long, default_value_t = 1.0)]
    pub preemptible: f64,
    /// With --preempt: which rules apply, comma-separated: overdue, priority, fair-share (or none);
    /// the default is the lab config's.
    #[arg(long, default_value = "overdue,priority")]
    pub preempt_rules: String,
    /// With --preempt: a job runs at least this long before it may be preempted.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub min_run: Duration,
    /// With --preempt: at most this many preemptions of one job in a day.
    #[arg(long, default_value_t = 3)]
    pub max_per_day: u32,
    /// With --preempt: the priority rule's gap.
    #[arg(long, default_value_t = 10)]
    pub priority_gap: i32,
    /// With --preempt: print only the `gantry+preempt` row (and fifo's, when it is the wait
    /// baseline of --seeds), not the plain gantry row: for sweeps, where the baseline is the same at
    /// every setting.
    #[arg(long)]
    pub preempt_only: bool,
}
