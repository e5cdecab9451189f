// The only module that touches @tauri-apps/*. Views receive a `Backend` and never import Tauri, so
// tests hand them a fake one. Each `invoke` names one Tauri command of src-tauri/src/lib.rs (same
// name, same arguments); the types are generated from the Rust ones (types.ts).

import { Channel, invoke } from "@tauri-apps/api/core";
import { listen } from "@tauri-apps/api/event";
import { getCurrentWebview } from "@tauri-apps/api/webview";
import { open } from "@tauri-apps/plugin-dialog";
import type {
  EngineInfo, EngineEvent, GpuMinute, GpuStatus, HistoryQuery, HistoryRow, JobChanged, JobDetail, JobState, Preview, QueueEntry, RecentSample, Status,
  SubmitResult, TimelineRun, UsageCharts, UsageReport, WhoAmI, GpuSample, Machines, ConnectionEvent, SessionAsk, Bookings, BookRequest, BookingView,
} from "./types";

export type Unsubscribe = () => void;

export interface Backend {
  engine(): Promise<EngineInfo>;
  status(): Promise<Status>;
  whoami(): Promise<WhoAmI>;
  queue(): Promise<QueueEntry[]>;
  job(id: number): Promise<JobDetail>;
  cancel(id: number): Promise<JobState>;
  setPriority(id: number, priority: number): Promise<boolean>;
  rerun(id: number): Promise<number>;
  gpus(): Promise<GpuStatus>;
  gpuRecent(since: number): Promise<RecentSample[]>;
  gpuMinutes(index: number, from: number, to: number): Promise<GpuMinute[]>;
  history(q: HistoryQuery): Promise<HistoryRow[]>;
  historyCount(q: HistoryQuery): Promise<number>;
  timeline(from: number, to: number): Promise<TimelineRun[]>;
  usage(sinceMs: number): Promise<UsageReport>;
  /** GPU-hours per user per `bucketMs`, and utilization by local day and hour (`tzOffsetMin` east of UTC). */
  usageCharts(sinceMs: number, bucketMs: number, tzOffsetMin: number): Promise<UsageCharts>;
  logs(id: number): Promise<string>;
  followLogs(id: number, onChunk: (text: string) => void): Unsubscribe;
  watchGpus(onSample: (at: number, gpus: GpuSample[]) => void): Unsubscribe;
  onJobChanged(cb: (ev: JobChanged) => void): Promise<Unsubscribe>;
  previewPaths(paths: string[]): Promise<Preview[]>;
  submitPaths(paths: string[]): Promise<SubmitResult[]>;
  pickFiles(): Promise<string[]>;
  openInbox(): Promise<void>;
  onFileDrop(onDrop: (paths: string[]) => void, onHover: (over: boolean) => void): Promise<Unsubscribe>;
  machines(): Promise<Machines>;
  /** Use this workstation's engine through ssh (null: this computer's). */
  connectMachine(host: string | null): Promise<EngineInfo>;
  forgetMachine(host: string): Promise<string[]>;
  onConnection(cb: (ev: ConnectionEvent) => void): Promise<Unsubscribe>;
  /** Queue a session (`gantry shell` / `gantry notebook`); its id. */
  startSession(ask: SessionAsk): Promise<number>;
  /** `gantry open ID PORT`: the port's URL on this computer (forwarded from a workstation), opened in the browser. */
  openPort(id: number, port: number | null): Promise<string>;
  copyText(text: string): Promise<void>;
  /** Open bookings (`all`: closed ones too) and the lab's rules (`gantry bookings`). */
  bookings(all: boolean): Promise<Bookings>;
  book(req: BookRequest): Promise<BookingView>;
  cancelBooking(id: number): Promise<BookingView>;
}

/** Query string for history endpoints (the engine parses it). */
export function historyQueryString(q: HistoryQuery): string {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(q)) {
    if (v !== undefined && v !== null && v !== "") p.set(k, String(v));
  }
  return p.toString();
}

export const tauriBackend: Backend = {
  engine: () => invoke("engine"),
  status: () => invoke("status"),
  whoami: () => invoke("whoami"),
  queue: () => invoke("queue"),
  job: (id) => invoke("job", { id }),
  cancel: (id) => invoke("cancel", { id }),
  setPriority: (id, priority) => invoke("set_priority", { id, priority }),
  rerun: (id) => invoke("rerun", { id }),
  gpus: () => invoke("gpus"),
  gpuRecent: (since) => invoke("gpu_recent", { since }),
  gpuMinutes: (index, from, to) => invoke("gpu_minutes", { index, from, to }),
  history: (q) => invoke("history", { query: historyQueryString(q) }),
  historyCount: (q) => invoke("history_count", { query: historyQueryString({ ...q, limit: undefined, offset: undefined, sort: undefined, asc: undefined }) }),
  timeline: (from, to) => invoke("timeline", { from, to }),
  usage: (sinceMs) => invoke("usage", { sinceMs }),
  usageCharts: (sinceMs, bucketMs, tzOffsetMin) => invoke("usage_charts", { sinceMs, bucketMs, tzOffsetMin }),
  logs: (id) => invoke("logs", { id }),
  followLogs(id, onChunk) {
    let live = true;
    const ch = new Channel<string>();
    ch.onmessage = (t) => { if (live) onChunk(t); };
    invoke("follow_logs", { id, onChunk: ch }).catch(() => {});
    // End the engine stream too: leaving the page must not keep a finished view's log flowing.
    return () => { live = false; invoke("unwatch", { id: ch.id }).catch(() => {}); };
  },
  watchGpus(onSample) {
    let live = true;
    const ch = new Channel<Extract<EngineEvent, { kind: "gpus" }>>();
    ch.onmessage = (m) => { if (live) onSample(m.at, m.gpus); };
    invoke("watch_gpus", { onSample: ch }).catch(() => {});
    // Also end the engine stream behind the channel: it would otherwise keep sending to a dead view.
    return () => { live = false; invoke("unwatch", { id: ch.id }).catch(() => {}); };
  },
  onJobChanged: (cb) => listen<JobChanged>("job-changed", (e) => cb(e.payload)),
  previewPaths: (paths) => invoke("preview_paths", { paths }),
  submitPaths: (paths) => invoke("submit_paths", { paths }),
  async pickFiles() {
    const r = await open({ multiple: true, filters: [{ name: "Job specs", extensions: ["yaml", "yml", "toml"] }] });
    if (!r) return [];
    return Array.isArray(r) ? r : [r];
  },
  openInbox: () => invoke("open_inbox"),
  machines: () => invoke("machines"),
  connectMachine: (host) => invoke("connect_machine", { host }),
  forgetMachine: (host) => invoke("forget_machine", { host }),
  onConnection: (cb) => listen<ConnectionEvent>("connection", (e) => cb(e.payload)),
  startSession: (ask) => invoke("start_session", { ask }),
  async openPort(id, port) {
    const url: string = await invoke("open_port", { id, port });
    // The opener plugin's own command; the window may open only loopback URLs: http://127.0.0.1:* (a
    // forward over ssh, a non-root engine) and a root engine's forwards, http://127.A.B.C:PORT/ (capabilities/default.json).
    await invoke("plugin:opener|open_url", { url });
    return url;
  },
  copyText: (text) => navigator.clipboard.writeText(text),
  bookings: (all) => invoke("bookings", { all }),
  book: (req) => invoke("book", { req }),
  cancelBooking: (id) => invoke("cancel_booking", { id }),
  async onFileDrop(onDrop, onHover) {
    return getCurrentWebview().onDragDropEvent((ev) => {
      const p = ev.payload;
      if (p.type === "over" || p.type === "enter") onHover(true);
      else if (p.type === "leave") onHover(false);
      else if (p.type === "drop") { onHover(false); onDrop(p.paths); }
    });
  },
};
