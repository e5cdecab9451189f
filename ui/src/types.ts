// Generated from the Rust protocol types (crates/gantry-core/src/protocol) by ts-rs: do not edit.
// Refresh: GANTRY_WRITE_TS=1 cargo test --workspace --lib types_ts

export type JobState = "queued" | "starting" | "running" | "succeeded" | "failed" | "cancelled" | "timed_out";
export const FINAL_STATES: JobState[] = ["succeeded", "failed", "cancelled", "timed_out"];
/**
 * How the app found the engine it talks to (`client::EngineRef`).
 */
export type EngineKind = "system" | "user" | "state_dir" | "embedded" | "holder" | "blocked" | "remote";
/**
 * Which engine the app talks to (from gantry-core's `EngineRef::view`).
 */
export type EngineInfo = { kind: EngineKind, 
/**
 * One line for the header.
 */
label: string, socket: string | null, 
/**
 * Why there is no engine (`blocked`: another user's engine holds this machine's GPUs), with what to do.
 */
problem: string | null, };
/**
 * The machine switcher: `current` is the remote host in use (`None`: this computer).
 */
export type Machines = { current: string | null, 
/**
 * Saved by the user (connected once), most recent first.
 */
saved: Array<string>, 
/**
 * From `~/.ssh/config`, not saved yet.
 */
ssh_config: Array<string>, };
/**
 * The app's `connection` event: a remote workstation's connection went away (`ok: false`, retried
 * after `retry_in_s`) or came back.
 */
export type ConnectionEvent = { host: string, ok: boolean, error?: string | null, retry_in_s?: number | null, };
/**
 * A session to queue, as `gantry shell` / `gantry notebook` and the app's "Start a session" ask for
 * one (`spec::session_spec` writes its spec; the lab's `[sessions]` bounds it at submit).
 */
export type SessionAsk = { 
/**
 * `Some(port)`: a notebook (`jupyter lab` on that port inside the container); `None`: a shell.
 */
notebook_port: number | null, gpus: number, 
/**
 * Per GPU (`20GiB`): share a GPU instead of taking a whole one.
 */
gpu_memory: string | null, gpu_type: string | null, 
/**
 * `None`: a shell runs in this machine's own folders (`image: host`), a notebook in the lab's
 * `[sessions] notebook_image`.
 */
image: string | null, 
/**
 * How long it may last (`2h`); `None`: the lab's `[sessions] default_length`.
 */
length: string | null, cpus: number | null, memory: string | null, 
/**
 * Its name in the queue (default: `shell` or `notebook`).
 */
name: string | null, };
/**
 * Where the GPU figures come from: the NVIDIA driver, or simulated GPUs (always said so).
 */
export type BackendKind = "nvml" | "simulated";
/**
 * A container labelled for this engine that its database does not know (e.g. after a lost WAL).
 * Reported, never adopted under a new job; its GPUs count as busy.
 */
export type Orphan = { container_id: string, name: string, job_id: number, running: boolean, gpus: Array<number>, };
/**
 * `GET /v1/status`.
 */
export type Status = { version: string, pid: number, gpu_backend: BackendKind, gpu_note: string | null, 
/**
 * The NVML library loaded instead of the driver's (`GANTRY_NVML_LIB`).
 */
gpu_library: string | null, gpu_count: number, 
/**
 * The caller's drop folder (under the system engine, the one in their home).
 */
inbox: string, state_dir: string, 
/**
 * The backend that runs the jobs (Docker, Slurm) cannot be reached (`docker_problem` before 0.2).
 */
backend_problem: string | null, 
/**
 * The state database cannot be written: nothing starts until it can.
 */
store_problem: string | null, 
/**
 * Docker's disk is below the lab's free-space minimum: no new job starts (the top writers named).
 */
disk_problem: string | null, 
/**
 * Whether each job's writable layer is bounded (`[disk] layer_size`), and why not where not.
 */
disk_note: string | null, 
/**
 * Containers labelled for this engine that its database does not know (never adopted).
 */
orphans: Array<Orphan>, 
/**
 * Value of the `dev.gantry.engine` label on this engine's containers.
 */
engine_id: string, 
/**
 * GPUs the lab config keeps for interactive use (never scheduled on).
 */
reserved_gpus: Array<number>, 
/**
 * The lab config the engine read (`None`: built-in defaults).
 */
config_file: string | null, 
/**
 * The machine's engine (`gantry daemon --system`), for every user.
 */
system: boolean, 
/**
 * The image `gantry notebook` uses without `--image` (`[sessions] notebook_image`).
 */
notebook_image?: string | null, };
/**
 * `GET /v1/whoami`: the caller, from the socket's peer credentials.
 */
export type WhoAmI = { uid: number, name: string, };
/**
 * What a notification is about. New kinds go at the end of [`NotifyEvent::ALL`]; each has a
 * stable snake_case name (the spec's `notify:`, `--on`, the webhook's `event`).
 */
export type NotifyEvent = "started" | "finished" | "failed" | "timed_out" | "cancelled" | "preempted" | "session_idle" | "booking_starting" | "store_problem" | "test" | "booking_released";
/**
 * The command a job runs: either a list (exec form) or a string run by `/bin/sh -c`.
 */
export type Command = string | Array<string>;
/**
 * `ipc` in a spec.
 */
export type Ipc = "private" | "host";
/**
 * `home` in a spec and in the lab config.
 */
export type Home = "tmpfs" | "mount";
/**
 * `ulimits` in a spec: each `unlimited` or a size.
 */
export type Ulimits = { 
/**
 * Locked memory (RDMA and pinned-memory transfers need it), e.g. `unlimited`.
 */
memlock?: string | null, 
/**
 * Stack size of each thread, e.g. `64MiB`.
 */
stack?: string | null, };
/**
 * `checkpoint` in a spec: the signal a preempted job gets, and how long it has to save and exit.
 */
export type Checkpoint = { 
/**
 * `SIGTERM` (default), `SIGUSR1`, `SIGUSR2`, `SIGINT`, `SIGHUP` or `SIGQUIT` (with or without `SIG`).
 */
signal?: string | null, 
/**
 * Time from the signal to the stop, e.g. `5m`. Default: the lab's stop grace; at most 1 hour.
 */
grace?: string | null, };
/**
 * A job reference in `after`.
 */
export type IdOrName = number | string;
/**
 * A matrix value.
 */
export type Scalar = number | number | boolean | string;
/**
 * A job as written by a researcher. Unknown fields are errors.
 */
export type JobSpec = { 
/**
 * Short name shown in the queue and history. Defaults to the file name.
 */
name?: string | null, 
/**
 * Docker image, e.g. `paddlepaddle/paddle:2.6.1-gpu-cuda12.0-cudnn8.9-trt8.6`. Left out, or
 * `host`: this machine's own system folders (`/usr`, `/etc`, `/opt`, … read-only) and your home
 * (read-write), so your conda env or venv runs as on the machine, still in a container with
 * its GPUs and limits (unless the lab turns it off).
 */
image: string, 
/**
 * Command: a list (exec form) or a string run with `/bin/sh -c`. Defaults to the image's CMD.
 */
command?: Command | null, 
/**
 * Working directory inside the container.
 */
workdir?: string | null, 
/**
 * Extra environment variables.
 */
env?: { [key in string]: string }, 
/**
 * Bind mounts, `host:container` or `host:container:ro`. Host paths are absolute or relative to the spec file;
 * each must exist and be readable (for read-write mounts, writable) by the submitter.
 */
mounts?: Array<string>, 
/**
 * TensorBoard log folder: the scalars of the event files in it (and in its subfolders) become
 * the job's metrics (`gantry show`, `gantry compare`), read while it runs and at its end.
 * Relative to `workdir`, or an absolute path inside the container under one of the job's mounts.
 */
tensorboard?: string | null, 
/**
 * Number of GPUs (0 allowed). Default 1.
 */
gpus: number, 
/**
 * GPU memory needed on each GPU, e.g. `20GiB`. When set, the job may share a GPU with others whose
 * declared memory fits; when absent, the job gets whole GPUs.
 */
gpu_memory?: string | null, 
/**
 * Only GPUs whose name contains this (any case), e.g. `H100` matches "NVIDIA H100 80GB HBM3".
 * `gantry gpus` lists the names.
 */
gpu_type?: string | null, 
/**
 * Only GPUs with at least this much memory in all, e.g. `40GiB`.
 */
min_gpu_memory?: string | null, 
/**
 * Higher runs first. Default 0.
 */
priority: number, 
/**
 * Wall-clock limit per attempt, e.g. `24h`, `90m`, counted from when it starts running. When it
 * passes the job is stopped (SIGTERM, then SIGKILL after the grace period) and ends `timed_out`,
 * never retried.
 */
timeout?: string | null, 
/**
 * How often to retry after a failure (a non-zero exit, out of memory, a lost container), with
 * exponential backoff; never after a timeout or a cancel. Default 0.
 */
retries: number, 
/**
 * How long the job is expected to run (`2h`). Lets the scheduler backfill and estimate start times.
 */
expected_runtime?: string | null, 
/**
 * Start only after these jobs succeeded: job ids, or names of your earlier jobs.
 */
after?: Array<IdOrName>, 
/**
 * Start no earlier than this, in the workstation's local time: `22:00` (today, or tomorrow once
 * past), `tomorrow 08:00`, `2026-12-03 09:30`, or `+2h` (from when it is queued). Until then it
 * waits ("starts at 22:00") and holds no GPUs and no reservation. At most the lab's
 * `max_begin` (a week) ahead.
 */
begin?: string | null, 
/**
 * Job array: one job per combination of values, e.g. `{lr: [0.1, 0.01], bs: [32, 64]}` makes 4
 * jobs. Each sees `{lr}` replaced in its command and `LR=0.1` in its environment.
 */
matrix?: { [key in string]: Array<Scalar> }, 
/**
 * CPUs the job may use, e.g. `8` or `0.5`. Default: the lab's share per GPU (`cpus_per_gpu`), or
 * `cpu_only_cpus` for a CPU-only job. The scheduler starts the job only when this many are free.
 */
cpus?: number | null, 
/**
 * RAM limit, e.g. `64GiB` (swap is not added on top). Default: the lab's share per GPU
 * (`memory_per_gpu`), or `cpu_only_memory` for a CPU-only job. Counted by the scheduler like CPUs.
 */
memory?: string | null, 
/**
 * Size of `/dev/shm` (PyTorch DataLoader workers pass batches through it), e.g. `16GiB`.
 * Default: half the job's memory limit (8 GiB without one); Docker's own is 64 MiB.
 */
shm_size?: string | null, 
/**
 * `private` (default) or `host`: share the host's IPC namespace (only where the lab config allows it).
 */
ipc?: Ipc | null, 
/**
 * Where `$HOME` points: `tmpfs` (an empty, writable folder for this job) or `mount` (your home
 * folder, read-write; only where the lab config enables it). Default: the lab's `home`.
 */
home?: Home | null, 
/**
 * Resource limits. Default: `memlock: unlimited`, `stack: 64MiB` (NVIDIA's advice for PyTorch/NCCL).
 */
ulimits?: Ulimits | null, 
/**
 * The most processes and threads the job may have at once, e.g. `512` (a runaway fork stops
 * there). Default, and the most a job may ask for: the lab's `pids_limit` (4096 unless the lab
 * config says otherwise).
 */
pids_limit?: number | null, 
/**
 * An interactive session (what `gantry shell` queues): the container gets a terminal that
 * `gantry attach ID` joins, its command defaults to your login shell (or `/bin/sh` where the
 * image lacks it), `timeout` is its length (bounded by the lab's `[sessions]`), it is never
 * retried and goes before batch jobs. Default false.
 */
interactive?: boolean, 
/**
 * Ports the job serves inside its container (a notebook, TensorBoard), e.g. `[8888]`.
 * `gantry open ID [PORT]` gives you (only you) a URL on this machine's loopback that reaches
 * it; nothing is published on the network. Serve on 127.0.0.1 inside the container.
 */
ports?: Array<number>, 
/**
 * Which of this job's events notify you, e.g. `[failed, timed_out]` (`[]`: none), sent to every
 * target of yours (`gantry notify add`), in place of each target's `--on` for this job. Events:
 * started, finished, failed, timed_out, cancelled, preempted.
 */
notify?: Array<NotifyEvent> | null, 
/**
 * May Gantry stop this job (after its checkpoint signal and grace) and queue it again at its
 * place, so that another job can start (the lab's `[preemption]` rules)? It then runs again from
 * its checkpoint and sees `GANTRY_RESTART_COUNT`. Default: the lab's `default_preemptible`
 * (`false` unless the lab config says otherwise).
 */
preemptible?: boolean | null, 
/**
 * How a preempted job is told to save its work: `{signal: SIGUSR1, grace: 5m}`. Default: SIGTERM
 * with the lab's stop grace.
 */
checkpoint?: Checkpoint | null, };
/**
 * The container settings a spec asked for, parsed (`None`: the lab's default).
 */
export type Limits = { 
/**
 * CPUs in thousandths.
 */
cpus_milli: number | null, memory: number | null, shm_size: number | null, 
/**
 * Bytes; -1 is unlimited (Docker's and the kernel's convention).
 */
memlock: number | null, stack: number | null, 
/**
 * Processes and threads at once.
 */
pids_limit: number | null, };
/**
 * One job of a `matrix` expansion.
 */
export type MatrixPart = { 
/**
 * Unique per expansion.
 */
group: string, index: number, count: number, 
/**
 * This job's `matrix` values (its params in `gantry show` and `gantry compare`).
 */
params?: { [key in string]: string }, };
export type Mount = { host: string, container: string, read_only: boolean, };
/**
 * A spec that passed every check, with sizes and durations parsed.
 */
export type ValidJob = { name: string, spec: JobSpec, gpus: number, 
/**
 * Declared memory per GPU in bytes; `None` means whole GPUs.
 */
gpu_memory: number | null, timeout: { secs: number, nanos: number } | null, retries: number, mounts: Array<Mount>, expected_runtime: { secs: number, nanos: number } | null, 
/**
 * CPU, RAM, shm and ulimits the spec set (the engine fills in the lab's defaults).
 */
limits: Limits, 
/**
 * Set on each job a `matrix` expanded into: its place among its siblings (the Slurm backend
 * submits them together as one job array).
 */
matrix_part?: MatrixPart | null, 
/**
 * `begin` as a moment (ms since the epoch), fixed when the job was queued (or previewed).
 */
begin_ms?: number | null, };
/**
 * A spec problem: what, where, and how to fix it.
 */
export type SpecError = { message: string, line: number | null, column: number | null, hint: string, };
/**
 * A spec file checked by the engine without queueing it (the app's preview).
 */
export type Preview = { path: string, file_name: string, job: ValidJob | null, error: string | null, spec_error: SpecError | null, 
/**
 * The dry run of a valid file (`POST /v1/jobs/preview`): the GPUs it would get now, or why it
 * would wait and until about when. `None` from an engine without dry runs.
 */
plan?: SubmitPreview | null, };
/**
 * One job of a [`SubmitPreview`].
 */
export type PreviewJob = { job: ValidJob, 
/**
 * It would start at once (on `gpus`).
 */
starts_now: boolean, 
/**
 * The GPUs it would get now (empty when it would wait, or needs none).
 */
gpus: Array<number>, 
/**
 * Why it would wait (the scheduler's words, as `gantry ls` shows them).
 */
reason?: string | null, 
/**
 * Estimated start (ms), from declared and learned runtimes, assuming nothing new arrives.
 */
estimated_start?: number | null, };
/**
 * `POST /v1/jobs/preview`: a dry run of `POST /v1/jobs` with the same [`SubmitRequest`], by the
 * same checks (as the caller: mounts, limits, the queue bound), and where and when its jobs would
 * start if queued now. Nothing is queued or written.
 */
export type SubmitPreview = { 
/**
 * The jobs it would queue (a `matrix` makes several), with the lab's defaults filled in.
 */
jobs: Array<PreviewJob>, 
/**
 * The lab's limits the submission meets, one line each (`priority 0 is within your range -10..10`).
 */
checks: Array<string>, };
/** Rust `Result<Vec<i64>, String>` as serde writes it: one per submitted file. */
export type SubmitResult = { Ok : Array<number> } | { Err : string };
/**
 * One run's use of what it held, over its attempts (`efficiency` in `GET /v1/jobs/{id}`). A figure
 * is absent when it could not be measured (a run shorter than one sample, the Slurm backend, a
 * CPU-only job's GPU figures).
 */
export type Efficiency = { 
/**
 * CPU time ÷ (CPUs held × time measured), 0..1.
 */
cpu?: number | null, 
/**
 * CPUs held (its limit).
 */
cpus_held: number, 
/**
 * CPUs it used on average (CPU time ÷ time measured).
 */
cpus_used?: number | null, 
/**
 * The most RAM it held (bytes, its cgroup's peak).
 */
ram_peak?: number | null, 
/**
 * RAM it was limited to (bytes).
 */
ram_held?: number | null, 
/**
 * Mean utilization of its GPUs while it ran, 0..1.
 */
gpu_util?: number | null, 
/**
 * One of its GPUs ran another job at the same time in some samples: `gpu_util` is the GPU's,
 * not this run's alone.
 */
gpu_shared: boolean, 
/**
 * The most GPU memory its processes held on one GPU (bytes).
 */
gpu_memory_peak?: number | null, 
/**
 * `gpu_memory_peak` is a simulated GPU's figure: the memory the job declared (or the card's).
 */
gpu_memory_simulated: boolean, 
/**
 * One GPU's memory (bytes), for "it fits on part of a card".
 */
gpu_memory_total?: number | null, 
/**
 * How long it was measured (ms, all attempts).
 */
measured_ms: number, 
/**
 * What its owner can do about it, one sentence each (empty: nothing to say).
 */
advice: Array<string>, };
/**
 * A job as one caller sees it. The row is public; `job` (the validated spec: command, env, mounts,
 * workdir) and `message` (free text that can quote the spec, e.g. Docker's errors about a mount)
 * are `None` with `spec_hidden: true` unless the caller may see the owner's private parts (the
 * owner, root and the lab's admins).
 */
export type Job = { id: number, name: string, owner_uid: number, owner_gid: number, owner: string, image: string, gpus: number, gpu_memory: number | null, priority: number, retries: number, timeout_ms: number | null, job: ValidJob | null, spec_hidden: boolean, state: JobState, source: string, submitted_at: number, not_before: number | null, started_at: number | null, finished_at: number | null, exit_code: number | null, attempts: number, cancel_requested: boolean, message: string | null, };
/**
 * A queued, starting or running job as `gantry ls` and the app's Queue view show it: its public row
 * only, the same for every caller (everyone sees the queue of a shared machine). The spec (command,
 * env, mounts, workdir), messages and output are not here; `gantry show` gives them to whoever may
 * see them. A field added here is shown to every user: add only what a row already shows.
 */
export type QueueJob = { id: number, name: string, owner_uid: number, owner: string, image: string, 
/**
 * GPUs it asks for (0: CPU only).
 */
gpus: number, 
/**
 * Declared memory per GPU in bytes; `None`: whole GPUs.
 */
gpu_memory?: number | null, priority: number, state: JobState, submitted_at: number, 
/**
 * When its first attempt started.
 */
started_at?: number | null, 
/**
 * Set for an interactive session (`gantry shell`, `gantry notebook`): the `interactive` class.
 */
session?: QueueSession | null, };
/**
 * What the queue shows of a session besides its row: when it ends and the ports `gantry open`
 * reaches (numbers inside its container; only its owner may open them).
 */
export type QueueSession = { 
/**
 * When it ends at the latest (its attempt's start plus its length); `None` while queued.
 */
ends_at: number | null, 
/**
 * Its spec's `ports` (known once it started).
 */
ports: Array<number>, };
/**
 * `GET /v1/jobs`: a running or queued job with the scheduler's verdict. A field that is `None` is
 * left out (a deep queue is 100,000 of these).
 */
export type QueueEntry = { job: QueueJob, 
/**
 * GPU indexes it holds (running); empty while queued and for CPU-only jobs.
 */
gpus_assigned: Array<number>, position?: number | null, reason?: string | null, 
/**
 * Estimated start (ms) from declared or learned runtimes, assuming nothing new arrives.
 */
estimated_start?: number | null, 
/**
 * How sure `estimated_start` is (`p50`: even odds).
 */
eta_confidence?: string | null, };
/**
 * `GET /v1/queue`: the part of the queue `gantry ls` shows: every starting and running job, the
 * first `limit` queued jobs in scheduling order and the first `limit` of the caller's own (by id).
 */
export type QueuePage = { jobs: Array<QueueEntry>, 
/**
 * Jobs queued in all (shown or not).
 */
queued: number, };
/**
 * Why an attempt ended.
 */
export type EndReason = "exited" | "oom" | "timeout" | "cancelled" | "lost" | "engine_error" | "preempted";
export type Attempt = { id: number, job_id: number, n: number, container_id: string | null, gpus: Array<number>, gpu_uuids: Array<string>, started_at: number, ended_at: number | null, exit_code: number | null, reason: EndReason | null, message: string | null, 
/**
 * The Slurm job id of an attempt submitted to Slurm (the Slurm backend).
 */
slurm_job_id?: number | null, 
/**
 * Its task in that Slurm job array, when a `matrix` went to Slurm as one array.
 */
slurm_array_task?: number | null, };
/**
 * A state change of a job.
 */
export type JobEvent = { job_id: number, at: number, from: string | null, to: string, message: string | null, };
/**
 * `GET /v1/jobs/{id}`. When `job.spec_hidden`, attempt and event messages are `None` too.
 */
export type JobDetail = { job: Job, attempts: Array<Attempt>, events: Array<JobEvent>, reason: string | null, 
/**
 * How well it used what it held (owner and admins only, like its log; absent before it ran).
 */
efficiency?: Efficiency | null, };
/**
 * The app's `job-changed` event: [`EngineEvent::Job`] without its tag.
 */
export type JobChanged = { job_id: number, state: JobState, at: number, };
export type GpuProcess = { pid: number, used_memory: number | null, 
/**
 * Docker container id (64 hex) when the process lives in a container.
 */
container_id: string | null, 
/**
 * Owner (uid of /proc/PID), when the process is still there.
 */
uid: number | null, 
/**
 * Command line (/proc/PID/cmdline, arguments joined by spaces, at most `gpu::COMMAND_MAX` chars).
 */
command: string | null, };
/**
 * The physical GPU a MIG instance belongs to.
 */
export type MigParent = { 
/**
 * The physical GPU's NVML index (as `nvidia-smi` numbers it).
 */
index: number, uuid: string, name: string, };
/**
 * How two GPUs are connected, closest first: NVLink, then NVML's common-ancestor levels.
 */
export type Link = "nvlink" | "same_board" | "pcie_switch" | "pcie_switches" | "host_bridge" | "numa_node" | "system";
export type GpuLink = { 
/**
 * The other GPU's index.
 */
peer: number, link: Link, };
export type GpuSample = { index: number, uuid: string, name: string, memory_total: number, memory_used: number, utilization: number, temperature_c: number | null, power_w: number | null, processes: Array<GpuProcess>, 
/**
 * Set when this device is a MIG instance: the physical GPU it is carved from.
 */
mig_parent?: MigParent | null, 
/**
 * How this GPU connects to each other GPU, when NVML reports a topology.
 */
links?: Array<GpuLink>, };
/**
 * One user of a GPU. A job of this engine has `job_id` (its processes on the GPU folded into one
 * row); anything else is outside Gantry: a process (`pid`, `user`, `command`, and `container` when it
 * runs in one), or a container that holds the GPU with no process on it yet (`container` only).
 */
export type GpuUser = { gpu: number, job_id: number | null, job_name: string | null, 
/**
 * The job's owner, or the process's user.
 */
user: string | null, pid: number | null, command: string | null, 
/**
 * Container name (or short id) of a process or container outside this engine's jobs.
 */
container: string | null, 
/**
 * GPU memory it uses, when NVML reports it.
 */
used_memory: number | null, 
/**
 * When the job started (ms).
 */
since: number | null, 
/**
 * Outside Gantry only: since when (ms) its GPU has read 0 % utilization, once that is a minute
 * or more ("idle for 2 h 10 min", so an admin can act). The engine's memory of its samples: an
 * engine restart starts the count again.
 */
idle_since?: number | null, };
/**
 * `users` and `reserved` come only from the `gpus` command, not from the live samples.
 */
export type GpuStatus = { backend: BackendKind, 
/**
 * Why NVML is not used, when it is not.
 */
note: string | null, gpus: Array<GpuSample>, 
/**
 * Which Gantry jobs hold which GPU.
 */
holders: Array<[number, Array<number>]>, 
/**
 * GPUs the lab config keeps for interactive use: Gantry never places jobs on them.
 */
reserved: Array<number>, 
/**
 * Everything on each GPU: this engine's jobs, and every process or container outside them.
 */
users: Array<GpuUser>, 
/**
 * The NVML library loaded instead of the driver's (`GANTRY_NVML_LIB`, e.g. a test double).
 */
library: string | null, };
/**
 * One second of `GET /v1/gpus/recent`: `[ms, per GPU [util %, memory used bytes]]`.
 */
export type RecentSample = [number, Array<[number, number]>];
/**
 * One minute of `GET /v1/gpus/{index}/minutes`: `[minute (ms), mean util %, mean memory used bytes]`.
 */
export type GpuMinute = [number, number, number];
/**
 * `GET /v1/events`, one per line: state changes and GPU samples.
 */
export type EngineEvent = { "kind": "job", job_id: number, state: JobState, at: number, } | { "kind": "gpus", at: number, gpus: Array<GpuSample>, };
/**
 * The values JSON has no number for.
 */
export type NonFinite = "NaN" | "Infinity" | "-Infinity";
/**
 * What a [`Num`] is in TypeScript (this type exists for `ui/src/types.ts` alone).
 */
export type Num = number | NonFinite;
/**
 * Which way is better for a metric.
 */
export type Goal = "min" | "max";
/**
 * Where a metric, param or tag came from.
 */
export type MetricSource = "file" | "tensorboard" | "mlflow" | "matrix";
/**
 * One logged value.
 */
export type MetricPoint = { 
/**
 * The step the job gave (`step` in a JSON line, the event's step, MLflow's `step`); without
 * one, how many points of this series were logged before it (all attempts).
 */
step: number, 
/**
 * When it was logged (ms since the epoch): the event's own time when the client gives one,
 * else when the engine read it.
 */
at: number, value: Num, 
/**
 * The job's attempt that logged it (1 for the first; a preempted or retried job has several).
 */
attempt: number, };
/**
 * One metric of one job, across its attempts.
 */
export type MetricSeries = { name: string, 
/**
 * Which way is better ([`Goal::of`] its name).
 */
goal: Goal, 
/**
 * Where its first point came from.
 */
source: MetricSource, 
/**
 * The value logged last (latest attempt, then latest logged); NaN when the run ended diverged.
 */
last: Num, last_step: number, 
/**
 * The best finite value ([`Goal`]); `None` while every value is NaN or infinite.
 */
best: Num | null, best_step: number | null, 
/**
 * Points logged in all (more than `points` holds once older points were thinned).
 */
count: number, 
/**
 * In logging order (attempt, then time). Thinned to the lab's bound, keeping the first, the
 * last, the lowest and the highest; further to the asked `max_points`; empty when 0 were asked.
 */
points: Array<MetricPoint>, };
/**
 * How reading a job's metrics went: what was dropped and why. Nothing here fails a job.
 */
export type IngestReport = { 
/**
 * Lines of `GANTRY_METRICS` that were not a JSON object (counted, skipped).
 */
garbage_lines: number, 
/**
 * TensorBoard records whose length or data CRC did not match, or that did not decode.
 */
bad_records: number, 
/**
 * Bytes read from metric files and folders, all attempts together.
 */
bytes_read: number, 
/**
 * Reading stopped at the lab's `[results] max_bytes_per_job`.
 */
bytes_limit_reached: boolean, 
/**
 * Bytes written to metric files beyond that bound, not read (the most seen left in one file;
 * MLflow: the largest request not kept).
 */
bytes_unread: number, 
/**
 * Points of metrics beyond the lab's `[results] max_series_per_job` (names not kept).
 */
dropped_points: number, 
/**
 * Distinct names not kept for that bound.
 */
dropped_names: number, 
/**
 * Human-readable notes, one per kind of problem, each saying what and where (`GANTRY_METRICS:
 * 3 lines are not JSON objects (first: line 7)`, `tensorboard: runs/ is not readable as alice`).
 */
notes: Array<string>, };
/**
 * `GET /v1/jobs/{id}/results`: what a job logged.
 */
export type JobResults = { job_id: number, 
/**
 * By name.
 */
metrics: Array<MetricSeries>, 
/**
 * The `matrix` values that made this job, then what its MLflow client logged (`log_param`).
 */
params: { [key in string]: string }, 
/**
 * Where each param came from.
 */
param_sources: { [key in string]: MetricSource }, 
/**
 * MLflow tags (`set_tag`; `mlflow.*` system tags included).
 */
tags: { [key in string]: string }, ingest: IngestReport, };
/**
 * `?max_points=` of `GET /v1/jobs/{id}/results`: at most this many points per series (first,
 * last, lowest and highest kept); absent: all stored; 0: summaries only.
 */
export type ResultsQuery = { max_points?: number, };
/**
 * `GET /v1/compare`: which runs, sorted by what. Give `ids` or `name`.
 */
export type CompareQuery = { 
/**
 * Job ids, comma-separated (`12,13,15`).
 */
ids?: string, 
/**
 * A sweep's name (its runs are `name[...]`) or a run's name (every run of that name).
 */
name?: string, 
/**
 * The metric rows are sorted by (best first); absent: the first metric (by name) all rows have.
 */
sort?: string, 
/**
 * Lower is better for `sort` (`--min`), whatever its name says ([`Goal::of`]).
 */
min?: boolean, };
/**
 * A metric column of a comparison.
 */
export type CompareMetric = { name: string, goal: Goal, };
/**
 * One run in a comparison.
 */
export type CompareRow = { job_id: number, name: string, owner: string, state: JobState, started_at: number | null, finished_at: number | null, 
/**
 * First start to end (or to now while it runs).
 */
duration_ms: number | null, 
/**
 * GPUs held × time, all attempts.
 */
gpu_hours: number, attempts: number, 
/**
 * Another user's run: its params and metrics are not shown to the caller.
 */
hidden: boolean, params: { [key in string]: string }, 
/**
 * Each metric's last value.
 */
last: { [key in string]: Num }, 
/**
 * Each metric's best value (absent while it has no finite one).
 */
best: { [key in string]: Num }, };
/**
 * `GET /v1/compare`: one row per run, best first.
 */
export type Comparison = { rows: Array<CompareRow>, 
/**
 * Every param name of the shown rows, sorted.
 */
params: Array<string>, 
/**
 * The params whose values differ between rows (what a sweep varied).
 */
differing: Array<string>, 
/**
 * Every metric of the shown rows, by name.
 */
metrics: Array<CompareMetric>, 
/**
 * The metric the rows are sorted by and which way (rows without it last); `None`: by id.
 */
sort: CompareMetric | null, };
/**
 * One completed run for `history`.
 */
export type HistoryRow = { id: number, name: string, owner: string, image: string, status: JobState, exit_code: number | null, gpus: Array<number>, gpu_uuids: Array<string>, submitted_at: number, started_at: number | null, finished_at: number | null, attempts: number, 
/**
 * The last value of the asked [`HistoryFilter::metric`]; absent when not asked, not logged, or
 * another user's run.
 */
metric?: Num | null, };
/**
 * `GET /v1/history` and `/v1/history/count`: which finished runs, in what order, which page.
 */
export type HistoryQuery = { user?: string, status?: JobState, 
/**
 * Finished at or after (ms).
 */
since?: number, limit?: number, offset?: number, 
/**
 * Substring of name or image.
 */
text?: string, 
/**
 * Image name (exact).
 */
image?: string, 
/**
 * Finished before (ms).
 */
until?: number, 
/**
 * Sort key: finished (default), started, duration, gpu_hours, name, owner, exit_code, id.
 */
sort?: string, 
/**
 * Ascending instead of descending.
 */
asc?: boolean, 
/**
 * A metric whose last value each row carries (`gantry history --metric M`): the caller's own
 * runs only (every run for admins).
 */
metric?: string, };
/**
 * A run on the GPU timeline.
 */
export type TimelineRun = { job_id: number, name: string, owner: string, gpus: Array<number>, start: number, end: number | null, reason: EndReason | null, };
/**
 * One user's figures in `gantry usage`.
 */
export type UserUsage = { user: string, 
/**
 * GPU count x run time of attempts, clipped to the window.
 */
gpu_hours: number, 
/**
 * Jobs that ended in the window (as `gantry history --since` lists them).
 */
jobs_finished: number, 
/**
 * Mean time from submit to first start of jobs first started in the window.
 */
mean_wait_ms: number | null, 
/**
 * Decayed GPU-hours now: what fair share orders equal-priority jobs by (lighter users first).
 */
fair_share_usage: number, 
/**
 * GPU-hours of attempts that ended by preemption in the window (part of `gpu_hours`): at most
 * what preemption cost the user (the work since their last checkpoint is the real loss).
 */
gpu_hours_preempted: number, };
/**
 * `gantry usage`: per user, over [since_ms, until_ms).
 */
export type UsageReport = { since_ms: number, until_ms: number, fair_share_half_life_ms: number, users: Array<UserUsage>, };
/**
 * GPU-hours of one user in one bucket (`gantry usage --csv`, the Usage view's stacked chart).
 */
export type UsageBucket = { 
/**
 * Start of the bucket (ms since the epoch; a local midnight or hour in the asked time zone).
 */
start: number, user: string, gpu_hours: number, };
/**
 * Mean GPU utilization (all GPUs, %) in one hour of one day: the heat map's cells.
 */
export type UtilCell = { 
/**
 * The local day's start (ms since the epoch).
 */
day: number, 
/**
 * 0 to 23, local.
 */
hour: number, utilization: number, };
/**
 * `GET /v1/usage/charts`.
 */
export type UsageCharts = { since_ms: number, until_ms: number, bucket_ms: number, buckets: Array<UsageBucket>, heat: Array<UtilCell>, };
/**
 * One user's held vs used in `gantry usage --efficiency`.
 */
export type UserEfficiency = { user: string, 
/**
 * GPU count × run time of attempts, clipped to the window.
 */
gpu_hours_held: number, 
/**
 * The same, weighted by each attempt's mean GPU utilization.
 */
gpu_hours_used: number, 
/**
 * Held GPU-hours of attempts without a GPU measure (the Slurm backend, a run under a second).
 */
gpu_hours_unmeasured: number, 
/**
 * Mean CPU efficiency of their attempts, weighted by CPUs × time (0..1).
 */
cpu?: number | null, runs: number, };
/**
 * The machine's held vs used GPU-hours in one local day.
 */
export type DayEfficiency = { 
/**
 * The local day's start (ms since the epoch).
 */
start: number, gpu_hours_held: number, gpu_hours_used: number, };
/**
 * `GET /v1/usage/efficiency`: over [since_ms, until_ms).
 */
export type EfficiencyReport = { since_ms: number, until_ms: number, users: Array<UserEfficiency>, days: Array<DayEfficiency>, };
/**
 * Where a notification goes.
 */
export type NotifyTarget = { "kind": "email", address: string, } | { "kind": "webhook", url: string, };
/**
 * One subscription. `owner` is `None` for the lab's own webhooks (`[notify] webhooks`).
 */
export type Subscription = { id: number, owner: string | null, target: NotifyTarget, on: Array<NotifyEvent>, job?: number | null, created_at: number, };
export type DeliveryState = "pending" | "delivered" | "failed" | "dropped";
/**
 * One notification to one target (`gantry notify log`).
 */
export type NotifyDelivery = { 
/**
 * Stable across retries and restarts: the webhook's `id` and `Gantry-Event-Id` header, the
 * email's `Message-ID` (a receiver that saw it already can drop the copy).
 */
id: string, event: NotifyEvent, job_id?: number | null, target: NotifyTarget, state: DeliveryState, tries: number, 
/**
 * When the event happened.
 */
at: number, 
/**
 * The next try, while pending.
 */
next_at?: number | null, 
/**
 * When it was delivered, given up or dropped.
 */
done_at?: number | null, last_error?: string | null, };
/**
 * The job a notification is about, as its webhook body carries it.
 */
export type NotifyJob = { id: number, name: string, owner: string, state: string, exit_code?: number | null, 
/**
 * Why it ended (may quote the spec): only in the owner's own notifications.
 */
message?: string | null, };
/**
 * A webhook's JSON body (schema `gantry.notification/1`, see the guide's "Notifications",
 * docs/book/src/notifications.md).
 * `text` is what Slack and Mattermost incoming webhooks show.
 */
export type NotifyPayload = { schema: string, id: string, event: NotifyEvent, 
/**
 * When it happened (ms since the epoch).
 */
at: number, 
/**
 * The machine (its host name).
 */
host: string, job?: NotifyJob | null, text: string, };
/**
 * Where a booking is in its life. Only `Booked` and `Active` hold GPUs; the others are history
 * (a booking is never deleted).
 */
export type BookingState = "booked" | "active" | "ended" | "cancelled" | "released";
/**
 * `POST /v1/bookings` ([`super::routes::BOOKINGS`]): book GPUs for the caller. Times are ms since
 * the epoch (the CLI reads `--at` in the caller's local time); both must lie on the lab's slots.
 */
export type BookRequest = { gpus: number, 
/**
 * Only GPUs whose name contains this (e.g. `A100`), as a job's `gpu_type`.
 */
gpu_type?: string | null, start_ms: number, end_ms: number, note?: string | null, };
/**
 * One booking as the caller may see it.
 */
export type BookingView = { id: number, owner: string, uid: number, gpus: number, gpu_type?: string | null, start_ms: number, end_ms: number, state: BookingState, 
/**
 * The owner's note: `None` for someone else's booking (unless the caller is root).
 */
note?: string | null, 
/**
 * Whether the caller owns it.
 */
mine: boolean, created_ms: number, 
/**
 * When it was cancelled, released or ended.
 */
closed_ms?: number | null, 
/**
 * Why it closed early ("released: unused for 30 min after its start", "cancelled by root").
 */
closed_why?: string | null, 
/**
 * While active: the GPUs (indices) it holds now.
 */
gpu_indices: Array<number>, 
/**
 * While active: non-preemptible jobs still on the GPUs it needs (it gets them as they end).
 */
waiting_for: Array<number>, };
/**
 * `GET /v1/bookings` ([`super::routes::BOOKINGS`]).
 */
export type BookingsQuery = { 
/**
 * Also the ones that ended, were cancelled or released (newest first, at most `limit`).
 */
all: boolean, limit?: number | null, };
/**
 * The lab's `[bookings]` rules, so clients can check (and draw) before asking.
 */
export type BookingRules = { enabled: boolean, 
/**
 * Starts and lengths are multiples of this (ms), counted from midnight UTC.
 */
slot_ms: number, 
/**
 * How far ahead a booking may start (ms from now).
 */
max_ahead_ms: number, 
/**
 * The longest a booking may be (ms; 0 from an engine older than this field).
 */
max_length_ms: number, 
/**
 * GPU-hours one user may have booked in a week (Monday 00:00 UTC to the next, by start);
 * `None`: no limit.
 */
max_gpu_hours_week?: number | null, 
/**
 * The most GPUs one booking may hold.
 */
max_gpus: number, 
/**
 * A booking none of its owner's jobs or sessions use this long after its start is released (ms).
 */
release_after_ms: number, };
/**
 * `GET /v1/bookings`: the bookings and the rules.
 */
export type Bookings = { now_ms: number, rules: BookingRules, 
/**
 * Open ones by start (and, with `all`, closed ones after them, newest first).
 */
bookings: Array<BookingView>, };
