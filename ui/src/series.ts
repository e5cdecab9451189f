// Rolling 1 Hz GPU samples for the live charts (last hour), in columnar form for uPlot.

import type { GpuSample, RecentSample } from "./types";

export const HOUR_MS = 3_600_000;

export class SeriesStore {
  ts: number[] = [];
  util: number[][] = [];
  memPct: number[][] = [];
  private totals: number[] = [];

  constructor(private keepMs = HOUR_MS) {}

  setTotals(gpus: { memory_total: number }[]) {
    this.totals = gpus.map((g) => g.memory_total);
  }

  loadRecent(rows: RecentSample[]) {
    for (const [at, per] of rows) this.push(at, per.map(([u, m]) => ({ utilization: u, memory_used: m })));
  }

  push(at: number, gpus: Pick<GpuSample, "utilization" | "memory_used">[]) {
    if (this.ts.length && at <= this.ts[this.ts.length - 1]) return;
    this.ts.push(at);
    gpus.forEach((g, i) => {
      (this.util[i] ??= new Array(this.ts.length - 1).fill(null)).push(g.utilization);
      const total = this.totals[i] || 1;
      (this.memPct[i] ??= new Array(this.ts.length - 1).fill(null)).push((100 * g.memory_used) / total);
    });
    const cutoff = at - this.keepMs;
    let drop = 0;
    while (drop < this.ts.length && this.ts[drop] < cutoff) drop++;
    if (drop > 0) {
      this.ts.splice(0, drop);
      this.util.forEach((s) => s.splice(0, drop));
      this.memPct.forEach((s) => s.splice(0, drop));
    }
  }

  /** uPlot data for one GPU over the last `minutes`: [seconds[], util[], mem%[]]. */
  window(gpu: number, minutes: number, now: number): [number[], number[], number[]] {
    const from = now - minutes * 60_000;
    let i = 0;
    while (i < this.ts.length && this.ts[i] < from) i++;
    return [this.ts.slice(i).map((t) => t / 1000), (this.util[gpu] ?? []).slice(i), (this.memPct[gpu] ?? []).slice(i)];
  }
}
