// Data shaping for the results views (issue 30 item 2): a run's metric curves (attempts joined), runs
// overlaid, the params table with differences, a sweep's params × metric. Pure: no DOM, no uPlot.
import type { CompareRow, Comparison, Efficiency, Goal, MetricSeries, Num } from "./types";

/** A wire value as a number (NaN and the infinities come as strings). */
export function num(v: Num | null | undefined): number | null {
  if (v === null || v === undefined) return null;
  if (typeof v === "number") return v;
  return v === "NaN" ? NaN : v === "Infinity" ? Infinity : -Infinity;
}

/** A value as a chart takes it: finite, or null (a gap: NaN and infinities are not drawn). */
function plotted(v: Num): number | null {
  const n = num(v);
  return n !== null && Number.isFinite(n) ? n : null;
}

/** `0.2315`, `NaN`, `inf`: as the CLI prints a value. */
export function fmtNum(v: Num | null | undefined): string {
  const n = num(v);
  if (n === null) return "–";
  if (Number.isNaN(n)) return "NaN";
  if (!Number.isFinite(n)) return n > 0 ? "inf" : "-inf";
  if (n !== 0 && (Math.abs(n) >= 1e6 || Math.abs(n) < 1e-4)) return n.toExponential(4);
  return String(+n.toPrecision(6));
}

/** One metric against step, attempts joined: points in attempt order then step, x the step; where an
 * attempt starts again below the step the previous one reached (a retry without a checkpoint), its
 * steps are drawn after it, so the curve never folds back. Returns [x, y] and where attempts begin. */
export function seriesXY(s: MetricSeries): { x: number[]; y: (number | null)[]; attemptStarts: number[] } {
  const pts = [...s.points].sort((a, b) => a.attempt - b.attempt || a.step - b.step);
  const x: number[] = [], y: (number | null)[] = [], attemptStarts: number[] = [];
  let offset = 0, lastX = -Infinity, attempt = -1;
  for (const p of pts) {
    if (p.attempt !== attempt) {
      attempt = p.attempt;
      offset = p.step + offset <= lastX ? lastX + 1 - p.step : offset;
      attemptStarts.push(p.step + offset);
    }
    const sx = p.step + offset;
    x.push(sx); y.push(plotted(p.value)); lastX = sx;
  }
  return { x, y, attemptStarts };
}

/** Several runs' curves of one metric on one x axis (uPlot's aligned data): the union of their steps,
 * null where a run has no point at that step. `runs`: label and series (absent: it did not log it). */
export function overlay(runs: { label: string; series: MetricSeries | undefined }[]): { labels: string[]; data: [number[], ...(number | null)[][]] } {
  const per = runs.map((r) => (r.series ? seriesXY(r.series) : { x: [], y: [] }));
  const xs = [...new Set(per.flatMap((p) => p.x))].sort((a, b) => a - b);
  const at = new Map(xs.map((x, i) => [x, i]));
  const ys = per.map((p) => {
    const col: (number | null)[] = xs.map(() => null);
    p.x.forEach((x, i) => { col[at.get(x)!] = p.y[i]; });
    return col;
  });
  return { labels: runs.map((r) => r.label), data: [xs, ...ys] };
}

/** Every metric name the runs logged, sorted. */
export function metricNames(results: { metrics: MetricSeries[] }[]): string[] {
  return [...new Set(results.flatMap((r) => r.metrics.map((m) => m.name)))].sort();
}

/** The params table: one row per param (differing ones first), one cell per run, `differs` marking
 * the params whose values are not all equal (a missing value counts as a value). */
export function paramsTable(c: Pick<Comparison, "rows" | "params" | "differing">): { name: string; differs: boolean; values: string[] }[] {
  const differing = new Set(c.differing);
  const rows = c.params.map((name) => ({ name, differs: differing.has(name), values: c.rows.map((r) => (r.hidden ? "hidden" : r.params[name] ?? "–")) }));
  return rows.sort((a, b) => Number(b.differs) - Number(a.differs) || a.name.localeCompare(b.name));
}

/** Whether `a` is better than `b` for a metric with this goal. */
function better(goal: Goal, a: number, b: number): boolean {
  return goal === "min" ? a < b : a > b;
}

/** A sweep's params × metric: the visible rows sorted by the metric's last value, best first (runs
 * without a finite value last), and the best run's id (null: none has a finite value). */
export function sweepRanking(rows: CompareRow[], metric: string, goal: Goal): { rows: CompareRow[]; best: number | null } {
  const val = (r: CompareRow) => { const v = r.hidden ? null : num(r.last[metric]); return v !== null && Number.isFinite(v) ? v : null; };
  const sorted = [...rows].sort((a, b) => {
    const va = val(a), vb = val(b);
    if (va === null || vb === null) return (va === null ? 1 : 0) - (vb === null ? 1 : 0) || a.job_id - b.job_id;
    return va === vb ? a.job_id - b.job_id : better(goal, va, vb) ? -1 : 1;
  });
  const best = sorted.length && val(sorted[0]) !== null ? sorted[0].job_id : null;
  return { rows: sorted, best };
}

/** One param against a metric, for its plot: x numeric when every value is a number, else the
 * distinct values in order of first appearance (`categories`, x their index). Hidden runs and runs
 * without a finite value of the metric are left out. */
export function paramPoints(rows: CompareRow[], param: string, metric: string): { x: number[]; y: number[]; ids: number[]; categories: string[] | null } {
  const use = rows.filter((r) => !r.hidden && r.params[param] !== undefined && Number.isFinite(num(r.last[metric]) ?? NaN));
  const raw = use.map((r) => r.params[param]);
  const numeric = raw.every((v) => v.trim() !== "" && Number.isFinite(Number(v)));
  const categories = numeric ? null : [...new Set(raw)];
  const x = raw.map((v) => (numeric ? Number(v) : categories!.indexOf(v)));
  const order = x.map((_, i) => i).sort((a, b) => x[a] - x[b]);
  return { x: order.map((i) => x[i]), y: order.map((i) => num(use[i].last[metric])!), ids: order.map((i) => use[i].job_id), categories };
}

/** The run page's efficiency lines: label and value, in the order the CLI prints them. */
export function efficiencyRows(e: Efficiency): [string, string][] {
  const pct = (x: number) => `${Math.round(x * 100)}%`;
  const gib = (b: number) => `${(b / 2 ** 30).toFixed(1)} GiB`;
  const bytes = (b: number) => (b >= 2 ** 30 ? gib(b) : `${(b / 2 ** 20).toFixed(1)} MiB`);
  const rows: [string, string][] = [];
  rows.push(["CPU", e.cpu != null && e.cpus_used != null ? `${pct(e.cpu)} (${e.cpus_used.toFixed(2)} of ${+e.cpus_held.toFixed(2)} CPUs held)` : `not measured (${+e.cpus_held.toFixed(2)} CPUs held)`]);
  rows.push(["RAM", e.ram_peak != null ? `peak ${bytes(e.ram_peak)}${e.ram_held != null ? ` of ${bytes(e.ram_held)} held` : ""}` : "not measured"]);
  if (e.gpu_util != null) rows.push(["GPU busy", `${pct(e.gpu_util)} of the time${e.gpu_shared ? " (its GPU ran other jobs too)" : ""}`]);
  if (e.gpu_memory_peak != null) rows.push(["GPU memory", `peak ${gib(e.gpu_memory_peak)}${e.gpu_memory_total != null ? ` of ${gib(e.gpu_memory_total)}` : ""}${e.gpu_memory_simulated ? " (simulated GPU: its declared memory)" : ""}`]);
  return rows;
}
