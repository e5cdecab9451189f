// A Backend for tests: canned data, records calls. No Tauri involved.
import type { Backend } from "./backend";
import type { BookingView, Bookings, EngineInfo, GpuSample, GpuUser, HistoryQuery, HistoryRow, JobSpec, QueueEntry, QueueSession, Status, UsageCharts, UsageReport, ValidJob } from "./types";

/** An engine's status: two simulated GPUs, no problems. */
export function engineStatus(over: Partial<Status> = {}): Status {
  return {
    version: "0", pid: 1, gpu_backend: "simulated", gpu_note: null, gpu_library: null, gpu_count: 2, inbox: "/home/ada/Gantry/inbox", state_dir: "/s",
    backend_problem: null, store_problem: null, disk_problem: null, disk_note: null, orphans: [], engine_id: "e", reserved_gpus: [], config_file: null, system: false, ...over,
  };
}

/** A checked spec as the engine returns it, with nothing but `spec` set beyond the defaults. */
export function validJob(name: string, spec: Partial<JobSpec> = {}): ValidJob {
  return {
    name, spec: { image: "img:1", gpus: 1, priority: 0, retries: 0, ...spec }, gpus: spec.gpus ?? 1, gpu_memory: null, timeout: null, retries: 0, mounts: [],
    expected_runtime: null, limits: { cpus_milli: null, memory: null, shm_size: null, memlock: null, stack: null, pids_limit: null },
  };
}

export function gpu(index: number, over: Partial<GpuSample> = {}): GpuSample {
  return { index, uuid: `GPU-${index}`, name: "Simulated GPU", memory_total: 24 << 30, memory_used: 0, utilization: 0, temperature_c: 40, power_w: 60, processes: [], ...over };
}

/** A GPU user: a Gantry job by default; pass `job_id: null` and pid/command/container for an outsider. */
export function gpuUser(gpu: number, over: Partial<GpuUser> = {}): GpuUser {
  return { gpu, job_id: 12, job_name: "train", user: "ada", pid: null, command: null, container: null, used_memory: null, since: null, idle_since: null, ...over };
}

/** Two users over the last 7 days, ada (the fake caller) the lighter one. */
/** Two days of two users' GPU-hours and a few utilization cells (UTC days). */
export function usageCharts(over: Partial<UsageCharts> = {}): UsageCharts {
  const day = 86_400_000, d0 = 20_000 * day;
  return {
    since_ms: d0, until_ms: d0 + 2 * day, bucket_ms: day,
    buckets: [
      { start: d0, user: "ada", gpu_hours: 3 }, { start: d0, user: "bob", gpu_hours: 5 },
      { start: d0 + day, user: "bob", gpu_hours: 2 },
    ],
    heat: [{ day: d0, hour: 9, utilization: 80 }, { day: d0, hour: 10, utilization: 40 }, { day: d0 + day, hour: 23, utilization: 5 }],
    ...over,
  };
}

export function usageReport(over: Partial<UsageReport> = {}): UsageReport {
  const now = Date.now();
  return {
    since_ms: now - 7 * 86_400_000, until_ms: now, fair_share_half_life_ms: 7 * 86_400_000,
    users: [
      { user: "bob", gpu_hours: 40.5, jobs_finished: 12, mean_wait_ms: 3_720_000, fair_share_usage: 31.25, gpu_hours_preempted: 1.5 },
      { user: "ada", gpu_hours: 2, jobs_finished: 3, mean_wait_ms: null, fair_share_usage: 1.5, gpu_hours_preempted: 0 },
    ],
    ...over,
  };
}

export function entry(id: number, over: Partial<QueueEntry["job"]> = {}, extra: Partial<QueueEntry> = {}): QueueEntry {
  return {
    job: {
      id, name: `job${id}`, owner_uid: 1000, owner: "ada", image: "img:1", gpus: 1, gpu_memory: null, priority: 0,
      state: "queued", submitted_at: Date.now() - 60_000, started_at: null, ...over,
    },
    gpus_assigned: [], position: 1, reason: "needs 1 free GPU, 0 available", estimated_start: null, eta_confidence: null, ...extra,
  };
}

/** A running session of ada's on GPU 0, ending in 1 h 20 min unless `session` says otherwise. */
export function sessionEntry(id: number, session: Partial<QueueSession> = {}, over: Partial<QueueEntry["job"]> = {}): QueueEntry {
  const now = Date.now();
  return entry(id, { name: "shell", image: "host", state: "running", started_at: now - 600_000, session: { ends_at: now + 80 * 60_000 + 30_000, ports: [], ...session }, ...over },
    { gpus_assigned: [0], position: null, reason: null });
}

/** The lab's rules: 1 h slots, 14 days ahead, 4 GPUs a booking, 40 GPU-hours a week, released after 30 min. */
export function bookings(list: BookingView[] = [], now = Date.now()): Bookings {
  return { now_ms: now, rules: { enabled: true, slot_ms: 3_600_000, max_ahead_ms: 14 * 86_400_000, max_length_ms: 86_400_000, max_gpu_hours_week: 40, max_gpus: 4, release_after_ms: 1_800_000 }, bookings: list };
}

/** One of ada's bookings (uid 1000), booked, 1 GPU; `over` changes anything. */
export function booking(id: number, startMs: number, hours: number, over: Partial<BookingView> = {}): BookingView {
  return { id, owner: "ada", uid: 1000, gpus: 1, gpu_type: null, start_ms: startMs, end_ms: startMs + hours * 3_600_000, state: "booked", note: null, mine: true, created_ms: 0,
    closed_ms: null, closed_why: null, gpu_indices: [], waiting_for: [], ...over };
}

export function makeRows(n: number): HistoryRow[] {
  return Array.from({ length: n }, (_, i) => ({
    id: n - i, name: `run-${n - i}`, owner: i % 2 ? "bob" : "ada", image: "img:1", status: i % 3 ? "succeeded" : "failed",
    exit_code: i % 3 ? 0 : 1, gpus: [i % 4], gpu_uuids: [], submitted_at: 0, started_at: 1000 * i, finished_at: 1000 * i + 3_600_000, attempts: 1,
  }));
}

export function fakeBackend(over: Partial<Backend> = {}) {
  const calls: { name: string; args: unknown[] }[] = [];
  const rows = makeRows(1000);
  const filter = (q: HistoryQuery) => rows.filter((r) => (!q.user || r.owner === q.user) && (!q.status || r.status === q.status) && (!q.text || r.name.includes(q.text)));
  const rec = <T>(name: string, v: T) => (...args: unknown[]) => { calls.push({ name, args }); return Promise.resolve(v); };
  const b: Backend = {
    engine: rec("engine", { kind: "embedded", label: "Engine in this app (simulated GPUs 2x24GiB)", socket: "/s/gantry.sock", problem: null } as EngineInfo),
    status: rec("status", engineStatus()),
    whoami: rec("whoami", { uid: 1000, name: "ada" }),
    queue: rec("queue", [] as QueueEntry[]),
    job: rec("job", undefined as any),
    cancel: rec("cancel", "queued"),
    setPriority: rec("setPriority", true),
    rerun: rec("rerun", 99),
    gpus: rec("gpus", { backend: "simulated", note: null, gpus: [gpu(0), gpu(1)], holders: [], reserved: [], users: [], library: null }),
    gpuRecent: rec("gpuRecent", []),
    gpuMinutes: rec("gpuMinutes", []),
    history: (q) => { calls.push({ name: "history", args: [q] }); const r = filter(q); return Promise.resolve(r.slice(q.offset ?? 0, (q.offset ?? 0) + (q.limit ?? 100))); },
    historyCount: (q) => { calls.push({ name: "historyCount", args: [q] }); return Promise.resolve(filter(q).length); },
    timeline: rec("timeline", []),
    usage: (sinceMs) => { calls.push({ name: "usage", args: [sinceMs] }); return Promise.resolve(usageReport()); },
    usageCharts: (sinceMs, bucketMs, tz) => { calls.push({ name: "usageCharts", args: [sinceMs, bucketMs, tz] }); return Promise.resolve(usageCharts()); },
    usageEfficiency: rec("usageEfficiency", { since_ms: 0, until_ms: 0, users: [], days: [] }),
    jobResults: rec("jobResults", { job_id: 0, metrics: [], params: {}, param_sources: {}, tags: {}, ingest: { garbage_lines: 0, bad_records: 0, bytes_read: 0, bytes_limit_reached: false, bytes_unread: 0, dropped_points: 0, dropped_names: 0, notes: [] } }),
    compare: rec("compare", { rows: [], params: [], differing: [], metrics: [], sort: null }),
    logs: rec("logs", ""),
    followLogs: () => () => {},
    watchGpus: () => () => {},
    onJobChanged: rec("onJobChanged", () => {}),
    previewPaths: rec("previewPaths", []),
    submitPaths: rec("submitPaths", []),
    pickFiles: rec("pickFiles", []),
    openInbox: rec("openInbox", undefined),
    onFileDrop: rec("onFileDrop", () => {}),
    machines: rec("machines", { current: null, saved: ["alice@ws1"], ssh_config: ["lab"] }),
    connectMachine: rec("connectMachine", { kind: "remote", label: "lab (through ssh)", socket: null, problem: null } as EngineInfo),
    forgetMachine: rec("forgetMachine", []),
    onConnection: rec("onConnection", () => {}),
    startSession: rec("startSession", 41),
    openPort: rec("openPort", "http://127.0.0.1:40001/lab?token=t"),
    copyText: rec("copyText", undefined),
    bookings: rec("bookings", bookings()),
    book: (req) => { calls.push({ name: "book", args: [req] }); return Promise.resolve(booking(50, req.start_ms, (req.end_ms - req.start_ms) / 3_600_000, { gpus: req.gpus, note: req.note ?? null })); },
    cancelBooking: (id) => { calls.push({ name: "cancelBooking", args: [id] }); return Promise.resolve(booking(id, 0, 1, { state: "cancelled" })); },
    ...over,
  };
  return { b, calls };
}

export const tick = () => new Promise((r) => setTimeout(r, 0));
export async function settle(n = 5) { for (let i = 0; i < n; i++) await tick(); }
