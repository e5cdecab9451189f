// GPU samples for the live charts (last hour), kept in one fixed-size buffer per GPU that all views share:
// the last 5 minutes as sampled, older samples decimated to the min and max of each 10 s bucket (so
// peaks stay on the chart). Memory stays flat however long the app is open or however fast the engine
// samples.

import type { GpuSample, RecentSample } from "./types";

export const HOUR_MS = 3_600_000;
/** Samples younger than this are kept as they are. */
export const RAW_MS = 5 * 60_000;
/** Older samples: min and max per bucket of this length. At 60 min over ~360 px, one bucket ≈ one pixel. */
export const BUCKET_MS = 10_000;
/** Raw samples kept at most (5 min at 1 Hz, twice over); faster sampling decimates earlier. */
export const RAW_CAP = 600;
const BUCKET_CAP = Math.ceil(HOUR_MS / BUCKET_MS) + 2;

/** Fixed-capacity FIFO of rows of `width` numbers in one Float64Array (no object per sample). */
export class Ring {
  private buf: Float64Array;
  private head = 0;
  len = 0;
  constructor(readonly cap: number, readonly width: number) { this.buf = new Float64Array(cap * width); }
  /** Appends a row; when full, the oldest row is overwritten. */
  push(...row: number[]) {
    const slot = (this.head + this.len) % this.cap;
    this.buf.set(row, slot * this.width);
    if (this.len < this.cap) this.len++;
    else this.head = (this.head + 1) % this.cap;
  }
  /** Column `k` of the i-th oldest row. */
  at(i: number, k: number): number { return this.buf[((this.head + i) % this.cap) * this.width + k]; }
  shift() { if (this.len) { this.head = (this.head + 1) % this.cap; this.len--; } }
}

/** One value's min and max within a bucket, in the order they occurred (the line then zigzags as the data did). */
class MinMax {
  min = Infinity; max = -Infinity; private minAt = 0; private maxAt = 0; private n = 0;
  add(v: number) {
    this.n++;
    if (v < this.min) { this.min = v; this.minAt = this.n; }
    if (v > this.max) { this.max = v; this.maxAt = this.n; }
  }
  pair(): [number, number] { return this.minAt <= this.maxAt ? [this.min, this.max] : [this.max, this.min]; }
}

/** One GPU's last hour: raw ring [t, util, mem%] and bucket ring [t0, utilA, utilB, memA, memB]. */
class GpuSeries {
  raw = new Ring(RAW_CAP, 3);
  old = new Ring(BUCKET_CAP, 5);
  private open: { t0: number; u: MinMax; m: MinMax } | null = null;

  push(at: number, util: number, mem: number) {
    this.raw.push(at, util, mem);
    while (this.raw.len && (this.raw.len === this.raw.cap || this.raw.at(0, 0) < at - RAW_MS)) {
      this.decimate(this.raw.at(0, 0), this.raw.at(0, 1), this.raw.at(0, 2));
      this.raw.shift();
    }
    while (this.old.len && this.old.at(0, 0) < at - HOUR_MS) this.old.shift();
  }

  private decimate(t: number, u: number, m: number) {
    const t0 = t - (t % BUCKET_MS);
    if (this.open && this.open.t0 !== t0) this.close();
    this.open ??= { t0, u: new MinMax(), m: new MinMax() };
    this.open.u.add(u);
    this.open.m.add(m);
  }

  private close() {
    const b = this.open!;
    this.old.push(b.t0, ...b.u.pair(), ...b.m.pair());
    this.open = null;
  }

  /** Points from `from` on: each bucket as two points (its first half and second half), then raw samples. */
  window(from: number): [number[], number[], number[]] {
    const ts: number[] = [], u: number[] = [], m: number[] = [];
    const bucket = (t0: number, ua: number, ub: number, ma: number, mb: number) => {
      if (t0 + BUCKET_MS <= from) return;
      ts.push(t0 / 1000, (t0 + BUCKET_MS / 2) / 1000); u.push(ua, ub); m.push(ma, mb);
    };
    for (let i = 0; i < this.old.len; i++) {
      const o = this.old;
      bucket(o.at(i, 0), o.at(i, 1), o.at(i, 2), o.at(i, 3), o.at(i, 4));
    }
    if (this.open) bucket(this.open.t0, ...this.open.u.pair(), ...this.open.m.pair());
    for (let i = 0; i < this.raw.len; i++) {
      const t = this.raw.at(i, 0);
      if (t < from) continue;
      ts.push(t / 1000); u.push(this.raw.at(i, 1)); m.push(this.raw.at(i, 2));
    }
    return [ts, u, m];
  }
}

export class SeriesStore {
  private gpus: GpuSeries[] = [];
  private totals: number[] = [];
  /** Time of the newest sample (0: none yet): a view that reopens asks the engine only for what is newer. */
  last = 0;

  setTotals(gpus: { memory_total: number }[]) {
    this.totals = gpus.map((g) => g.memory_total);
  }

  loadRecent(rows: RecentSample[]) {
    for (const [at, per] of rows) this.push(at, per.map(([u, m]) => ({ utilization: u, memory_used: m })));
  }

  push(at: number, gpus: Pick<GpuSample, "utilization" | "memory_used">[]) {
    if (at <= this.last) return;
    this.last = at;
    gpus.forEach((g, i) => {
      (this.gpus[i] ??= new GpuSeries()).push(at, g.utilization, (100 * g.memory_used) / (this.totals[i] || 1));
    });
  }

  /** Points held for one GPU: raw samples and decimated buckets. */
  size(gpu: number): { raw: number; buckets: number } {
    const g = this.gpus[gpu];
    return { raw: g?.raw.len ?? 0, buckets: g?.old.len ?? 0 };
  }

  /** uPlot data for one GPU over the last `minutes`: [seconds[], util[], mem%[]]. */
  window(gpu: number, minutes: number, now: number): [number[], number[], number[]] {
    return this.gpus[gpu]?.window(now - minutes * 60_000) ?? [[], [], []];
  }
}

/** The app's one store of live GPU samples (the GPUs view fills it; it outlives the view). */
export const gpuSeries = new SeriesStore();

/** A live chart that shows one flat line across its whole window (an idle GPU, a steady job) looks the
 * same a second later: a key for that picture, so the view can skip redrawing it; `null` when the picture
 * moves (values change, the line does not reach the window's left edge yet, or the newest point is old).
 * `from` and `now` in seconds, like the window's times. */
export function steadyKey(w: [number[], number[], number[]], from: number, now: number, minutes: number): string | null {
  const [ts, u, m] = w;
  if (!ts.length || ts[0] > from + BUCKET_MS / 1000 || ts[ts.length - 1] < now - 3) return null;
  for (let k = 1; k < ts.length; k++) if (u[k] !== u[0] || m[k] !== m[0]) return null;
  return `${minutes}:${u[0]}:${m[0]}`;
}
