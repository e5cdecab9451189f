// Shapes of the engine API (gantry-core), as the app receives them.

export type JobState = "queued" | "starting" | "running" | "succeeded" | "failed" | "cancelled" | "timed_out";
export const FINAL_STATES: JobState[] = ["succeeded", "failed", "cancelled", "timed_out"];

/** Which engine the app talks to (from gantry-core's `EngineRef::view`). */
export interface EngineInfo {
  kind: "system" | "user" | "state_dir" | "embedded" | "holder" | "blocked" | "remote";
  label: string; socket: string | null;
  /** Why there is no engine (`blocked`: another user's engine holds this machine's GPUs). */
  problem: string | null;
}
export interface Status {
  version: string; pid: number; gpu_backend: "nvml" | "simulated"; gpu_note: string | null;
  gpu_count: number; inbox: string; state_dir: string; backend_problem: string | null; store_problem?: string | null; engine_id: string;
}
export interface WhoAmI { uid: number; name: string }

export interface JobSpec {
  name?: string; image: string; command?: string | string[]; workdir?: string; env?: Record<string, string>;
  mounts?: string[]; gpus: number; gpu_memory?: string; priority: number; timeout?: string; retries: number;
}
export interface ValidJob { name: string; spec: JobSpec; gpus: number; gpu_memory: number | null; retries: number }
/** `job` (the spec) and `message` are null, with `spec_hidden`, for other users' jobs (owner and root only). */
export interface Job {
  id: number; name: string; owner_uid: number; owner: string; image: string; gpus: number; gpu_memory: number | null;
  priority: number; retries: number; timeout_ms: number | null; job: ValidJob | null; spec_hidden: boolean; state: JobState; source: string;
  submitted_at: number; not_before: number | null; started_at: number | null; finished_at: number | null;
  exit_code: number | null; attempts: number; cancel_requested: boolean; message: string | null;
}
export interface QueueEntry { job: Job; gpus_assigned: number[]; position: number | null; reason: string | null; estimated_start?: number | null; eta_confidence?: string | null }
export interface Attempt {
  id: number; job_id: number; n: number; container_id: string | null; gpus: number[]; gpu_uuids: string[];
  started_at: number; ended_at: number | null; exit_code: number | null; reason: string | null; message: string | null;
}
export interface JobEvent { job_id: number; at: number; from: string | null; to: string; message: string | null }
export interface JobDetail { job: Job; attempts: Attempt[]; events: JobEvent[]; reason: string | null }

export interface GpuProcess { pid: number; used_memory: number | null; container_id: string | null }
export interface GpuSample {
  index: number; uuid: string; name: string; memory_total: number; memory_used: number; utilization: number;
  temperature_c: number | null; power_w: number | null; processes: GpuProcess[];
}
/** One user of a GPU (gantry-core `GpuUser`): a job of this engine (`job_id`), or anything outside Gantry
 * (a process: `pid`, `user`, `command`, `container` when it runs in one; or a container alone). */
export interface GpuUser {
  gpu: number; job_id: number | null; job_name: string | null; user: string | null; pid: number | null;
  command: string | null; container: string | null; used_memory: number | null; since: number | null;
}
/** `users` and `reserved` come only from the `gpus` command, not from the live samples. */
export interface GpuStatus {
  backend: "nvml" | "simulated"; note: string | null; gpus: GpuSample[]; holders: [number, number[]][];
  reserved: number[]; users: GpuUser[]; library: string | null;
}
/** [ms, per GPU [util %, memory used bytes]] */
export type RecentSample = [number, [number, number][]];

export interface HistoryRow {
  id: number; name: string; owner: string; image: string; status: JobState; exit_code: number | null;
  gpus: number[]; gpu_uuids: string[]; submitted_at: number; started_at: number | null; finished_at: number | null; attempts: number;
}
export interface HistoryQuery {
  user?: string; status?: string; image?: string; text?: string; since?: number; until?: number;
  sort?: string; asc?: boolean; limit?: number; offset?: number;
}
export interface TimelineRun { job_id: number; name: string; owner: string; gpus: number[]; start: number; end: number | null; reason: string | null }

export interface SpecError { message: string; line: number | null; column: number | null; hint: string }
export interface Preview { path: string; file_name: string; job: ValidJob | null; error: string | null; spec_error: SpecError | null }
/** Rust `Result<i64, String>` as serialized by serde. */
export type SubmitResult = { Ok: number[] } | { Err: string };

/** gantry-core `UsageReport`: per user over [since_ms, until_ms), as `gantry usage` prints it. */
export interface UserUsage { user: string; gpu_hours: number; jobs_finished: number; mean_wait_ms: number | null; fair_share_usage: number }
export interface UsageReport { since_ms: number; until_ms: number; fair_share_half_life_ms: number; users: UserUsage[] }
/** The machine switcher: `current` is the remote host in use (null: this computer). */
export interface Machines { current: string | null; saved: string[]; ssh_config: string[] }
/** A remote workstation's connection went away (`ok: false`, retried after `retry_in_s`) or came back. */
export interface ConnectionEvent { host: string; ok: boolean; error?: string; retry_in_s?: number }
