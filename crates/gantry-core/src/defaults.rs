//! Every built-in tunable with its default and the reason for it. Imports nothing: the lab config
//! (`policy`), the engine and the scheduler read their defaults from here, and the lab config
//! (`/etc/gantry/config.toml`) overrides most of them (see `packaging/config.toml`).

use std::time::Duration;

/// SIGTERM -> SIGKILL grace on cancel and timeout: long enough for a training loop to write a checkpoint.
pub const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long the GPU processes of this engine's container whose attempt just ended still count as
/// this engine's, not outside use, while GPU samples keep listing them (NVML and Docker take a moment
/// to let a stopped container go): a minute is many samples (1 Hz), while a container that still
/// holds a GPU long after its attempt ended is something else's problem and shows as outside use.
pub const LEAVING_MAX: Duration = Duration::from_secs(60);
/// A pull not finished by then is stopped and its jobs fail (`[images] pull_timeout`): a large CUDA
/// image (10-20 GB) over a slow 100 Mbit/s link takes about 25 min; a registry that hangs must not
/// keep its jobs waiting for ever.
pub const PULL_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Below this much free space on Docker's disk no new job starts (`[disk] min_free`): room for the
/// running jobs' checkpoints (a few GB each), an image pull and the engine's own database and logs
/// (the state dir is often on the same disk), while a nearly full disk is still recoverable.
pub const DISK_MIN_FREE: u64 = 10 << 30;
/// Each job's writable layer where the storage driver can bound it (`[disk] layer_size`): far more
/// than a job writes beside its mounts (pip installs, caches), far less than a 1-2 TB disk.
pub const LAYER_SIZE: u64 = 100 << 30;
/// How often Docker's free space is looked at (ms) while jobs wait.
pub const DISK_EVERY_MS: i64 = 10_000;
/// A job sharing a GPU may use this much more GPU memory than its `gpu_memory` before it is warned
/// (`[jobs] gpu_memory_margin`, in percent): frameworks round allocations up and a CUDA context
/// takes a few hundred MiB that users rarely declare; far more than that crowds out the neighbours
/// the declaration let in.
pub const GPU_MEMORY_MARGIN_PCT: f64 = 20.0;
/// How long a warned job may stay over before it is stopped (`[jobs] gpu_memory_grace`): a
/// cuDNN autotune or a validation step may spike briefly; 30 s past it, its neighbours' OOMs are the
/// likelier cost.
pub const GPU_MEMORY_GRACE: Duration = Duration::from_secs(30);
/// A running job that outlives its declared `expected_runtime` by more than this (`[jobs]
/// overrun_margin`), or by a tenth of the declaration when that is longer ([`OVERRUN_FRACTION_DIV`]),
/// broke its promise: the scheduler stops trusting its end and may preempt it for the reservation it
/// blocks. 30 s covers what a declaration cannot know (the container's start, a framework's import
/// and CUDA init, the log's last flush, one engine pass) on a job declared in seconds, while a
/// job that lied to be backfilled is caught within half a minute of its promise.
pub const OVERRUN_MARGIN: Duration = Duration::from_secs(30);
/// ... or a tenth of the declared runtime (divide by this), when longer: a 10-hour job is judged
/// on an hour, not 30 s (a declaration is an estimate that grows less exact with the run).
pub const OVERRUN_FRACTION_DIV: i64 = 10;
/// An owner whose attempts overran their declared runtime (past the margin) at least this many
/// times within [`OVERRUN_WINDOW_MS`] has their declarations replaced, for the scheduler, by the
/// longer of the declaration and the learned p80 of that job shape (`estimate::trusted_runtime`):
/// once is enough, because an honest user loses little (a declaration is only lengthened to what
/// their own runs took), and a liar gains backfill at most once a window.
pub const OVERRUN_STRIKES: u32 = 1;
/// How far back overruns count (7 days: a week's work, then a clean slate).
pub const OVERRUN_WINDOW_MS: i64 = 7 * 24 * 3_600_000;
/// Outside use of a GPU (a process or container not this engine's) that has lasted this long (ms)
/// is someone's work, not a stale sample: a job that cannot start without that GPU gives up its
/// reservation and its claims, so the other GPUs go to other jobs (issue 18 item 7). NVML is sampled
/// every second and a stopped job's process may be listed for a few samples; a probe such as
/// `nvidia-smi` lasts less than a second. A minute is past both, and short next to any job's wait.
pub const OUTSIDE_SETTLE_MS: i64 = 60_000;
/// A process outside Gantry on a GPU that has read 0 % utilization this long is shown as "idle for
/// ..." (`gantry gpus`, the GPUs view): long enough that a training loop's pause (data loading, a
/// checkpoint) is not called idle, short enough to show a forgotten notebook within the minute.
pub const OUTSIDE_IDLE_SHOWN_AFTER: Duration = Duration::from_secs(60);
/// Per-job log cap: a runaway `print` in a loop must not fill the disk the queue lives on.
pub const LOG_CAP: u64 = 64 << 20;
/// The longest line of a job's output kept whole: the rest of a longer one (a job writing 40 MB
/// without a newline) is left out with a note, so the engine's memory per job stays bounded.
pub const LINE_MAX: usize = 64 << 10;
/// A progress bar's current state (the last `\r` segment of a line not ended yet) is written to the
/// job's log at most this often, so `logs -f` and the app show it while it runs...
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// ... and, once a job's progress states have taken 1/16 of its log cap, only this often (a
/// week-long bar must not crowd the job's real output out of its log).
pub const PROGRESS_SLOW: Duration = Duration::from_secs(60);
/// The first this many bytes of a progress state are shown (progress bars are one short line).
pub const PROGRESS_MAX: usize = 1 << 10;
/// Docker keeps a container's own log (json-file) in this many files of `log cap / 2` each: twice
/// Gantry's cap in all, room for the cap's worth of output plus json-file's per-line overhead, so an
/// engine that was away still finds what it would have kept, and Docker's disk never holds more.
pub const DOCKER_LOG_FILES: u64 = 4;
/// Processes (threads count) a job may have, unless the lab sets `[containers] pids_limit`: far above
/// what a training with many DataLoader workers uses, far below what takes a machine down.
pub const PIDS_LIMIT: i64 = 4096;
/// An interactive session without `--for` lasts this long: an afternoon's debugging; a session is
/// a held GPU, so it should end on its own when forgotten.
pub const SESSION_LENGTH: Duration = Duration::from_secs(4 * 3600);
/// The longest session the lab allows unless `[sessions] max_length` says otherwise: a working day.
pub const SESSION_MAX_LENGTH: Duration = Duration::from_secs(12 * 3600);
/// `[sessions] max_gpus`: GPUs one user's sessions may ask for together. A session jumps the queue
/// and is never preempted (someone is at its terminal); two GPUs are enough to try a multi-GPU step,
/// and bigger work is a batch job, which shares the machine as it goes.
pub const SESSION_MAX_GPUS: u32 = 2;
/// `[sessions] idle_after`: how long a session's GPUs may sit at 0 % before it is warned (then ended a
/// quarter of that later).
pub const SESSION_IDLE_AFTER: Duration = Duration::from_secs(3600);
/// `[bookings] max_ahead`: two weeks: a demo or a deadline is planned about that far ahead, and no
/// one books the machine for the whole term.
pub const BOOKING_MAX_AHEAD: Duration = Duration::from_secs(14 * 24 * 3600);
/// `[bookings] max_length`: a day: a demo, a deadline's run or a course's lab session fits in one;
/// longer work is queued as jobs, which share the machine as they go.
pub const BOOKING_MAX_LENGTH: Duration = Duration::from_secs(24 * 3600);
/// `[bookings] max_gpu_hours_per_week`: 48 GPU-hours per user per week (2 GPUs for a day, or 4 GPUs
/// for an afternoon a day): a fraction of even a small box's 672 (4 GPUs × 168 h), so a few users'
/// bookings cannot take the machine from the queue.
pub const BOOKING_MAX_GPU_HOURS_PER_WEEK: u32 = 48;
/// `[bookings] slot`: half-hours, as in a calendar.
pub const BOOKING_SLOT: Duration = Duration::from_secs(30 * 60);
/// `[bookings] release_after`: a booking nobody used for half an hour after its start is a no-show.
pub const BOOKING_RELEASE_AFTER: Duration = Duration::from_secs(30 * 60);
/// A booking's owner is told it starts soon (`booking_starting`) this long before its start: the
/// same lead as a session's first end-of-length warning, time enough to get to the machine or queue
/// the demo's job.
pub const BOOKING_STARTING_LEAD: Duration = Duration::from_secs(15 * 60);
/// Warnings written into a session's terminal this long before its end: time to save work (15 min)
/// and a last call (5 min).
pub const SESSION_WARNINGS: [Duration; 2] = [Duration::from_secs(15 * 60), Duration::from_secs(5 * 60)];
/// First retry delay; doubles per attempt, capped at [`RETRY_BACKOFF_MAX`].
pub const RETRY_BACKOFF: Duration = Duration::from_secs(10);
/// A failing job retries at most every 10 minutes, so it cannot churn through containers.
pub const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(600);
/// GPU sampling period: NVML's utilization counters are averaged over ~1 s anyway.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// Fair share: a user's GPU-hours count half as much after a day (a day's burst is forgiven by tomorrow).
pub const FAIR_SHARE_HALF_LIFE: Duration = Duration::from_secs(24 * 3600);
/// A job that cannot start for this long reserves GPUs (no starvation).
pub const RESERVE_AFTER: Duration = Duration::from_secs(30 * 60);
/// Retention is enforced at start and then this often.
pub const PRUNE_EVERY: Duration = Duration::from_secs(3600);
/// Fair share looks back this many half-lives (older use has decayed below 1/32).
pub const FAIR_SHARE_REACH: i64 = 5;
/// Priorities a plain user may set: enough to order one's own work, too little to jump everyone.
pub const USER_PRIORITY: (i32, i32) = (-10, 10);
/// `[preemption] priority_gap`: one more than a user's highest priority, so a user's own top
/// priority never preempts another's priority-0 job by priority alone (only an admin's, or a job whose
/// owner lowered it below 0).
pub const PRIORITY_GAP: i32 = USER_PRIORITY.1 + 1;
/// Root (the admin) may go further, still bounded so ordering stays meaningful.
pub const ADMIN_PRIORITY: (i32, i32) = (-1000, 1000);
/// Queued jobs per user: a week of a busy lab's work; a runaway script hits it long before the database hurts.
pub const MAX_QUEUED_PER_USER: usize = 2000;
/// Scheduling passes run at least this often (time-based events: backoff ends, timeouts, reservations).
pub const PASS_EVERY: Duration = Duration::from_secs(1);
/// ... and at most every 50 ms, so a burst of submits coalesces into few passes.
pub const PASS_MIN_GAP: Duration = Duration::from_millis(50);
/// A pass whose inputs (queue, running jobs, GPUs, health) have not changed plans again only after
/// this long: what the clock alone moves (reservations past `reserve_after`, backfill windows) is
/// measured in minutes, so 10 s is never noticed; at 100k queued it keeps an idle engine's planning
/// under 1% of a core. A retry's backoff ending triggers a pass on time.
pub const FULL_PASS_EVERY_MS: i64 = 10_000;
/// With nothing queued, other containers' GPUs are listed this often (only `gantry gpus` shows them;
/// the app re-reads holders every 5 s). With jobs queued, every pass lists them: placement needs them.
pub const FOREIGN_IDLE_EVERY_MS: i64 = 5_000;
/// Fair-share usage and typical waits change slowly: refresh every 30 s.
pub const STATS_EVERY_MS: i64 = 30_000;
/// The runtime estimator learns from this many most recent successful runs (each group keeps its
/// last `estimate::WINDOW`); reread with the other stats.
pub const HISTORY_RUNS: usize = 5000;
/// Start estimates replay the queue (quadratic): every 5 s at most, and only for up to this many jobs.
pub const ETA_EVERY_MS: i64 = 5_000;
pub const ETA_MAX_QUEUE: usize = 500;
/// When the database cannot be written, try again this often (nothing starts meanwhile).
pub const STORE_RETRY: Duration = Duration::from_secs(2);
/// When Docker is unreachable, retry waits and log streams this often.
pub const DOCKER_RETRY: Duration = Duration::from_secs(1);
/// A start that failed for a reason outside the job (Docker away) is retried after this long.
pub const TRANSIENT_RETRY_MS: i64 = 5_000;

/// The system engine's socket: a fixed place every user's CLI and app look for first.
pub const SYSTEM_SOCKET: &str = "/run/gantry/gantry.sock";
/// The system engine's state.
pub const SYSTEM_STATE_DIR: &str = "/var/lib/gantry";
/// Lab-wide template folders of the system engine (root-owned; users drop into `<inbox>/<name>/`).
pub const SYSTEM_TEMPLATES_DIR: &str = "/etc/gantry/templates";
/// Each user's drop folder under the system engine, relative to their home.
pub const INBOX_PATH: &str = "Gantry/inbox";
/// Folders of one user's drop folder (the folder and its template folders) the engine watches with
/// inotify: far more template folders than anyone uses, and small next to root's
/// `fs.inotify.max_user_watches` (8,192 on older kernels; shared by every root process), so one
/// user's tree of folders cannot use up the watches of the others and of root's other programs.
/// Past it, or when the kernel refuses a watch, the folder's other folders are scanned instead.
pub const INBOX_WATCHES_PER_USER: usize = 256;
/// How often a drop folder is scanned (the safety net for lost events; the only way to see the
/// folders past [`INBOX_WATCHES_PER_USER`]).
pub const INBOX_RESCAN: Duration = Duration::from_secs(10);
/// The system engine looks for new group members (and drop folders that went away) this often.
pub const USER_INBOX_RESCAN: Duration = Duration::from_secs(60);

// Container defaults for deep learning ([containers] in the lab config).
/// `/dev/shm` of a job without a memory limit (with one: half of it). Docker's own 64 MiB kills
/// PyTorch DataLoader workers.
pub const SHM_WITHOUT_MEMORY_LIMIT: u64 = 8 << 30;
/// Thread stack limit: NVIDIA's recommended `--ulimit stack=67108864` for PyTorch/NCCL containers.
pub const STACK_LIMIT: i64 = 64 << 20;
/// CPU (thousandths) and RAM kept for the OS, Docker and the engine: jobs share the rest.
pub const RESERVE_CPUS_MILLI: u64 = 1000;
pub const RESERVE_MEMORY: u64 = 2 << 30;

// The API on its Unix socket.
/// Every client sends its whole request head right after connecting; 10 s covers a heavily loaded
/// machine and still recycles a slow-loris connection quickly (hyper's own default is 30 s).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A CLI holds one connection at a time; the app holds a few (events, a log tail, polling). 64 is
/// room for several apps, scripts and `logs -f` tails of one person, and 8 people's worth is `MAX_CONNECTIONS`.
pub const MAX_CONNECTIONS_PER_UID: usize = 64;
/// Log streams (`gantry logs`, `logs -f`, the app's log views) one uid may have open: a person
/// follows a few jobs in a few terminals and the app; each stream costs a descriptor, a task and up
/// to ~1 MiB of buffers (a chunk in flight plus hyper's write queue), so 16 of one user's slow
/// readers pin at most ~16 MiB, where unbounded readers of a 64 MiB log once pinned 1.7 GiB.
pub const LOG_STREAMS_PER_USER: usize = 16;
/// Half of the usual 1024 soft descriptor limit, so even if raising it fails the store, logs,
/// Docker and the drop folder keep 500+ descriptors.
pub const MAX_CONNECTIONS: usize = 512;

// Submits sent again (an idempotency key).
/// A client resends a submit whose answer it lost within seconds (once the engine is back); a day
/// covers an engine down overnight and still forgets keys long before they could pile up.
pub const SUBMIT_KEY_TTL: Duration = Duration::from_secs(24 * 3600);
/// Keys one uid holds at most (the oldest are forgotten first): a resend comes seconds after its
/// first try, so only the newest matter, and a script flooding keys costs the database at most
/// ~2 MB per user.
pub const SUBMIT_KEYS_PER_USER: i64 = 10_000;

// Recovery.
/// A container created this recently and never started is looked at again once this much time has
/// passed since its creation before it is taken for never started: the engine that created it calls
/// `start` milliseconds later, and a start sent just before a crash may not have reached Docker yet.
pub const START_SETTLE: Duration = Duration::from_secs(5);

// Forwards and listeners (issue 29).
/// `[sessions] forward_port`: the port of every `gantry open` forward (each job's on an address of its
/// own in 127.0.0.0/8). Below 1024, so only root can bind it: when the engine is not listening (a
/// restart, the job's end, a preemption) no other user can answer an owner's old URL. 1021 is RFC 3692's
/// port for experiments: no service uses it, and browsers do not block it.
pub const FORWARD_PORT: u16 = 1021;
/// A forward's refused connections (another user's) are logged once per uid, then summed up at most
/// this often: a connect flood costs a line a minute, not a line a connection.
pub const FORWARD_REFUSED_LOG_EVERY: Duration = Duration::from_secs(60);
/// `[metrics] max_connections`: open scrape connections at once. Prometheus keeps one per scraper; 64
/// covers a lab's few scrapers and a curl or two, while a flood of idle connections costs the engine at
/// most this many file descriptors (its API and jobs keep the rest). Beyond it a connection is closed at once.
pub const METRICS_MAX_CONNECTIONS: usize = 64;
/// `[metrics] idle_timeout`: a connection that has not sent a whole request head this long after it
/// opened (or after its last answer) is closed. A scrape sends its request at once; 10 s is far
/// above a loaded machine's delay and far below what lets idle connections pile up.
pub const METRICS_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Queued jobs `gantry ls` shows by default: the next 100 to start and the caller's first 100 (a
/// terminal shows a few dozen lines; `--all` lists a queue of 100,000, which is 25 MB of JSON).
pub const LS_QUEUED_SHOWN: usize = 100;

/// Notification tries before one is given up: with the backoff below, about 40 minutes of a
/// webhook or relay being down (a deploy, a restart) is ridden out; longer is an outage to report.
pub const NOTIFY_MAX_TRIES: u32 = 8;
/// The wait after a notification's first failed try; doubles per try, capped at [`NOTIFY_BACKOFF_MAX`].
pub const NOTIFY_BACKOFF: Duration = Duration::from_secs(10);
pub const NOTIFY_BACKOFF_MAX: Duration = Duration::from_secs(3600);
/// One user's notifications waiting to be sent at once: a retrying target (or a flood of short
/// jobs) cannot grow the outbox without bound; beyond it new ones are recorded as dropped.
pub const NOTIFY_MAX_PENDING: usize = 100;
/// Targets per user (`gantry notify add`): a few emails and chat channels; each is one send per event.
pub const NOTIFY_MAX_TARGETS: usize = 10;
/// `[notify] max_tests_per_hour`: `gantry notify test` checks a target just added; a few an hour is
/// plenty, and each goes to every target, so a user's test mail stays under 60 an hour.
pub const NOTIFY_MAX_TESTS_PER_HOUR: usize = 6;
/// A job's name as it appears in a notification's line (an email's subject): long enough to tell
/// jobs apart, too short to carry a message of its own.
pub const NOTIFY_NAME_CHARS: usize = 40;
/// One send (connect, TLS, request, answer) may take this long before it counts as failed.
pub const NOTIFY_SEND_TIMEOUT: Duration = Duration::from_secs(20);
/// Sends in flight at once (a slow target does not hold up the others).
pub const NOTIFY_PARALLEL: usize = 8;
/// Delivered, failed and dropped notifications are listed (`gantry notify log`) this long, then forgotten.
pub const NOTIFY_KEEP: Duration = Duration::from_secs(30 * 24 * 3600);
/// How far ahead a job's `begin` may be (`[limits] max_begin`): a week covers "after the weekend"
/// and "when the deadline crunch is over"; a waiting job still counts against the user's queued
/// jobs, so further ahead it mostly sits there forgotten (a booking is the way to plan further).
pub const MAX_BEGIN: Duration = Duration::from_secs(7 * 86_400);

/// Points kept per metric series (`[results] max_points`); older points are thinned beyond it,
/// keeping the first, the last, the lowest and the highest: a chart is at most a few thousand
/// pixels wide, and 200 series of 5,000 points are ~40 MB of database per job at worst.
pub const RESULTS_MAX_POINTS: u32 = 5_000;
/// Distinct metric names kept per job (`[results] max_series`): real runs log tens, a few hundred
/// with per-layer statistics; a job logging a new name per step (a bug, or a hostile one) would
/// otherwise grow the database and every comparison without bound.
pub const RESULTS_MAX_SERIES: u32 = 200;
/// Longest metric, param or tag name kept, in bytes (`[results] max_name_len`): MLflow's own limit
/// is 250; a longer "name" is data, not a name, and every comparison prints it.
pub const RESULTS_MAX_NAME_LEN: u32 = 250;
/// Bytes read from one job's metric files and event files, all attempts (`[results]
/// max_bytes_per_job`): 1,000 points/s of 60-byte lines for a day is ~5 GB of which a chart needs
/// nothing more; 1 GiB is a week of a line per step at 30 steps/s, and bounds the engine's CPU spent
/// on one job's files.
pub const RESULTS_MAX_BYTES: u64 = 1 << 30;
/// How often a running job's metric files and event files are read (ms): a chart a few seconds
/// behind is live enough, and each read is one `read` per file.
pub const RESULTS_READ_EVERY_MS: u64 = 2_000;
/// Longest `GANTRY_METRICS` line read (bytes); a longer one is garbage (skipped to its end): a line
/// of a few hundred metrics is ~10 KiB.
pub const RESULTS_LINE_MAX: usize = 64 << 10;
/// Most bytes read from one file per read (a 1 GB file is read over many passes, never held).
pub const RESULTS_READ_CHUNK: usize = 4 << 20;
/// Largest request body a job's MLflow endpoint reads (bytes): a `log-batch` at MLflow's own limits
/// (1,000 metrics, 100 params of 500 bytes, 100 tags) is well under it; larger is refused (413).
pub const MLFLOW_BODY_MAX: usize = 1 << 20;
/// Connections open at once to one job's MLflow endpoint: its client keeps one or two (a pool);
/// more are closed, so a job cannot make the engine hold an unbounded number of sockets.
pub const MLFLOW_CONNECTIONS: usize = 16;
/// Requests one job's MLflow endpoint handles per second (more wait their turn): each is a write
/// of the engine's database; MLflow's Python client makes a few hundred calls a second at most
/// (each waits for its answer), and `log_batch` carries up to 1,000 metrics in one.
pub const MLFLOW_REQUESTS_PER_S: u32 = 1_000;
/// How long a job's MLflow endpoint waits for a request's headers or body before closing.
pub const MLFLOW_IDLE: Duration = Duration::from_secs(30);
/// Longest a string command waits for its MLflow endpoint to be bound before it runs anyway (it is
/// bound tens of ms after the container starts; the wait ends at once then): bounds the delay when
/// the engine cannot bind it or stops meanwhile.
pub const START_GATE_WAIT: Duration = Duration::from_secs(5);
/// Most runs one `gantry compare` shows: a large sweep is a few hundred; a table of more is read
/// by a script (`--json`), which can ask again by ids.
pub const COMPARE_MAX_RUNS: usize = 2_000;

// Efficiency advice (issue 30 item 3): `gantry show` and the run page say what a run's owner can
// change, from what the engine measured. Built-in, not lab settings: they only choose which sentences
// are printed, never what a job may do.

/// No advice on a run measured less than this (ms): a framework's start (imports, CUDA init, the
/// first batches loaded) reads as idle GPUs and one busy CPU, which says nothing of the training.
pub const EFFICIENCY_ADVICE_AFTER_MS: i64 = 60_000;
/// GPUs busy less than this share of the time (0..1) get the input-pipeline advice: a healthy
/// training keeps its GPU above 60-90 %; below 30 % the GPU mostly waits for data.
pub const GPU_UTIL_LOW: f64 = 0.3;
/// ... and when the CPUs it held were busier than this (0..1) meanwhile, it is CPU-bound: ask for
/// more CPUs rather than tune the loader.
pub const CPU_BOUND: f64 = 0.9;
/// A run that used less than this share of the CPUs it held (0..1), holding at least
/// [`CPU_ADVICE_MIN_MILLI`], is told what to declare instead: the rest could run another job.
pub const CPU_USED_LOW: f64 = 0.5;
/// ... not below 2 CPUs held: one idle CPU is not worth a sentence.
pub const CPU_ADVICE_MIN_MILLI: u64 = 2000;
/// A whole-GPU run whose processes never held more than this share of one card's memory (0..1) is
/// told it could share a card (`gpu_memory`): half a card leaves room for a neighbour as large.
pub const GPU_MEMORY_SHARE_MAX: f64 = 0.5;
/// ... and a run that declared `gpu_memory` but used less than this share of it is told to declare
/// less, so more jobs fit beside it.
pub const GPU_MEMORY_USED_LOW: f64 = 0.5;
/// The suggested `gpu_memory` (or `memory`) is the peak plus this share, rounded up to a GiB:
/// allocators round up and a longer run (a larger batch at the end, validation) peaks higher.
pub const MEMORY_ADVICE_HEADROOM: f64 = 0.1;
/// A run whose RAM peak stayed under this share of its limit (0..1), with a limit of at least
/// [`RAM_ADVICE_MIN`], is told what `memory` to declare: the rest could go to other jobs.
pub const RAM_USED_LOW: f64 = 0.25;
/// ... not below 4 GiB held: small limits are the lab's per-GPU share, not the user's ask.
pub const RAM_ADVICE_MIN: u64 = 4 << 30;
/// A running job's measures are written to the database at most this often (ms), and at its end:
/// an engine restart loses at most this much of a run's figures, at one small write per job.
pub const EFFICIENCY_SAVE_EVERY_MS: i64 = 15_000;

/// CPU-only jobs together hold at most this many of the machine's equal CPU/RAM shares (one per GPU
/// plus one): the one share the README keeps for CPU-only work, so one user's CPU-only jobs can never
/// take the share a GPU needs to start a job (issue 33: five CPU-only jobs once idled four GPUs).
pub const CPU_ONLY_SHARES: u32 = 1;
