// The Usage view's chart data, computed from the engine's buckets (pure: no DOM, no uPlot).

/** One stacked bar chart's data: bucket starts (s, for uPlot), users (most GPU-hours first), each
 * user's GPU-hours per bucket, and the running sums drawn (a user's bar reaches `stacked[i]`). */
export interface Stacked { x: number[]; users: string[]; values: number[][]; stacked: number[][] }

/** GPU-hours per (bucket, user) as stacked series over every bucket of [since, until). Empty
 * buckets are 0; users are ordered by their total, largest at the bottom. */
export function stackUsage(buckets: { start: number; user: string; gpu_hours: number }[], since: number, until: number, bucketMs: number, tzOffsetMin = 0): Stacked {
  const tz = tzOffsetMin * 60_000;
  const first = Math.floor((since + tz) / bucketMs) * bucketMs - tz;
  const starts: number[] = [];
  for (let t = first; t < until; t += bucketMs) starts.push(t);
  const total = new Map<string, number>();
  for (const b of buckets) total.set(b.user, (total.get(b.user) ?? 0) + b.gpu_hours);
  const users = [...total.keys()].sort((a, b) => (total.get(b)! - total.get(a)!) || a.localeCompare(b));
  const index = new Map(starts.map((t, i) => [t, i]));
  const values = users.map(() => starts.map(() => 0));
  for (const b of buckets) {
    const i = index.get(b.start);
    if (i !== undefined) values[users.indexOf(b.user)][i] += b.gpu_hours;
  }
  const stacked = values.map((_, u) => starts.map((_, i) => values.slice(0, u + 1).reduce((s, v) => s + v[i], 0)));
  return { x: starts.map((t) => t / 1000), users, values, stacked };
}

/** A heat map's grid: one row per local day (oldest first), 24 hours each; `null` where no sample. */
export interface Heat { days: number[]; cells: (number | null)[][] }

export function heatGrid(heat: { day: number; hour: number; utilization: number }[], since: number, until: number, tzOffsetMin = 0): Heat {
  const dayMs = 86_400_000, tz = tzOffsetMin * 60_000;
  const days: number[] = [];
  for (let d = Math.floor((since + tz) / dayMs) * dayMs - tz; d < until; d += dayMs) days.push(d);
  const cells = days.map(() => new Array<number | null>(24).fill(null));
  for (const c of heat) {
    // The engine computes days in the same time zone; round so a few minutes' drift never drops a cell.
    const r = days.length ? Math.round((c.day - days[0]) / dayMs) : -1;
    if (r >= 0 && r < days.length && c.hour >= 0 && c.hour < 24) cells[r][c.hour] = c.utilization;
  }
  return { days, cells };
}

/** A cell's colour: transparent when idle, then the accent colour more opaque with more use. */
export function heatColor(util: number | null): string {
  if (util === null) return "rgba(128,128,128,0.08)";
  const a = Math.max(0.06, Math.min(1, util / 100));
  return `rgba(47,111,222,${a.toFixed(2)})`;
}
