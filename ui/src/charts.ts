// uPlot wrapper (kept apart so view tests can run without a canvas).
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import { heatColor, type Heat, type Stacked } from "./usage-data";

export interface Chart { setData(d: [number[], ...number[][]]): void; destroy(): void }

/** uPlot options for a 0–100 % chart of one or two named series. The legend names the series only: a
 * live legend would show "Time: --" and "value: --" rows until hovered (and redo DOM work on every move). */
/** "now", "−30s", "−5m": a live chart's x axis, in seconds before now. */
export function agoLabel(s: number): string {
  if (s >= 0) return "now";
  return s % 60 === 0 ? `−${-s / 60}m` : `−${-s}s`;
}

/** `live`: x values are seconds relative to now and the axis always shows the last `live()` seconds,
 * so the axis never moves and a steady line looks the same a second later (nothing to redraw). */
export function chartOptions(width: number, height: number, labels: string[], css: (name: string, fallback: string) => string, live?: () => number): uPlot.Options {
  const colors = [css("--chart-a", "#2f6fde"), css("--chart-b", "#d9822b")];
  const axis = { stroke: css("--fg-muted", "#888"), grid: { stroke: "rgba(128,128,128,0.15)" } };
  const x = live ? { ...axis, incrs: [15, 30, 60, 120, 300, 600, 900, 1800], values: (_u: uPlot, v: number[]) => v.map(agoLabel) } : axis;
  return {
    width, height,
    scales: { y: { range: [0, 100] }, ...(live ? { x: { time: false, range: (): uPlot.Range.MinMax => [-live(), 0] } } : {}) },
    legend: { show: true, live: false },
    cursor: { show: false },
    axes: [x, { ...axis, values: (_u: uPlot, v: number[]) => v.map((x) => `${x}%`) }],
    series: [{}, ...labels.map((label, i) => ({ label, stroke: colors[i], width: 1.5, ...(i === 0 ? { fill: colors[i] + "22" } : {}) }))],
  };
}

export function lineChart(el: HTMLElement, width: number, height: number, labels: string[], live?: () => number): Chart {
  const style = getComputedStyle(document.documentElement);
  const css = (name: string, fallback: string) => style.getPropertyValue(name).trim() || fallback;
  const u = new uPlot(chartOptions(width, height, labels, css, live), [[], ...labels.map(() => [])], el);
  return { setData: (d) => u.setData(d), destroy: () => u.destroy() };
}

const PALETTE = ["#2f6fde", "#d9822b", "#29a36a", "#b04fc4", "#d64545", "#7a8b99", "#c9b22e", "#3fb6c9"];

/** Stacked bars of GPU-hours per user (uPlot's bars path; each user's series is its running sum,
 * drawn from the top of the stack down so lower users stay visible). */
export function stackedBars(el: HTMLElement, width: number, height: number, s: Stacked, label: (t: number) => string, bucketMs = 86_400_000): Chart {
  const style = getComputedStyle(document.documentElement);
  const fg = style.getPropertyValue("--fg-muted").trim() || "#888";
  const axis = { stroke: fg, grid: { stroke: "rgba(128,128,128,0.15)" } };
  const bars = uPlot.paths.bars!({ size: [0.8, 64] });
  const b = bucketMs / 1000;
  const order = s.users.map((_, i) => s.users.length - 1 - i); // top of the stack first
  const opts: uPlot.Options = {
    width, height,
    scales: { x: { time: false, range: (_u, min, max) => [min - b / 2, max + b / 2] }, y: { range: (_u, _min, max) => [0, max > 0 ? max * 1.15 : 1] } },
    legend: { show: true, live: false },
    cursor: { show: false },
    axes: [
      // One tick per bucket (or every few), each labelled once.
      { ...axis, incrs: [b, 2 * b, 3 * b, 6 * b, 7 * b, 12 * b, 14 * b], values: (_u: uPlot, v: number[]) => v.map((x) => label(x * 1000)) },
      { ...axis, size: 64, values: (_u: uPlot, v: number[]) => v.map((x) => `${+x.toPrecision(3)} h`) },
    ],
    series: [{}, ...order.map((u) => ({ label: s.users[u], stroke: PALETTE[u % PALETTE.length], fill: PALETTE[u % PALETTE.length], width: 0, paths: bars, points: { show: false } }))],
  };
  const data = (d: Stacked): uPlot.AlignedData => [d.x, ...order.map((u) => d.stacked[u])];
  const u = new uPlot(opts, data(s), el);
  return { setData: (d) => u.setData(d as uPlot.AlignedData), destroy: () => u.destroy() };
}

/** The heat map, drawn by uPlot: x is the hour of day, y the day; each cell is painted in a draw
 * hook (uPlot has no heat map series), the axes and sizing are uPlot's. */
export function heatMap(el: HTMLElement, width: number, height: number, g: Heat, dayLabel: (t: number) => string): Chart {
  const style = getComputedStyle(document.documentElement);
  const fg = style.getPropertyValue("--fg-muted").trim() || "#888";
  const axis = { stroke: fg, grid: { show: false } };
  const n = g.days.length;
  const opts: uPlot.Options = {
    width, height,
    scales: { x: { time: false, range: [0, 24] }, y: { range: [0, Math.max(1, n)] } },
    legend: { show: false },
    cursor: { show: false },
    axes: [
      { ...axis, incrs: [3], values: (_u: uPlot, v: number[]) => v.map((x) => `${String(x).padStart(2, "0")}:00`) },
      // A label in the middle of each day's row (the oldest day on top).
      { ...axis, size: 110, splits: () => g.days.map((_, r) => n - r - 0.5), values: (_u: uPlot, v: number[]) => v.map((y) => dayLabel(g.days[n - 1 - Math.floor(y)] ?? 0)) },
    ],
    series: [{}, { show: false }],
    hooks: {
      draw: [(u: uPlot) => {
        const ctx = u.ctx;
        for (let r = 0; r < n; r++) {
          for (let hr = 0; hr < 24; hr++) {
            const x0 = u.valToPos(hr, "x", true), x1 = u.valToPos(hr + 1, "x", true);
            const y0 = u.valToPos(n - r, "y", true), y1 = u.valToPos(n - r - 1, "y", true);
            ctx.fillStyle = heatColor(g.cells[r][hr]);
            ctx.fillRect(x0 + 1, y0 + 1, x1 - x0 - 2, y1 - y0 - 2);
          }
        }
      }],
    },
  };
  const u = new uPlot(opts, [[0, 24], [null, null]] as uPlot.AlignedData, el);
  return { setData: () => u.redraw(), destroy: () => u.destroy() };
}

/** Curves (or points) on a free y axis: a metric against step, runs overlaid, a param against a
 * metric. `points`: dots only (a scatter); `xLabels`: category names for x (its values are indexes). */
export function xyChart(el: HTMLElement, width: number, height: number, labels: string[], opts: { points?: boolean; xLabels?: string[] | null } = {}): Chart {
  const style = getComputedStyle(document.documentElement);
  const fg = style.getPropertyValue("--fg-muted").trim() || "#888";
  const axis = { stroke: fg, grid: { stroke: "rgba(128,128,128,0.15)" } };
  const cats = opts.xLabels;
  const o: uPlot.Options = {
    width, height,
    scales: { x: { time: false, ...(cats ? { range: (): uPlot.Range.MinMax => [-0.5, cats.length - 0.5] } : {}) } },
    legend: { show: labels.length > 1, live: false },
    cursor: { show: false },
    axes: [cats ? { ...axis, incrs: [1], values: (_u: uPlot, v: number[]) => v.map((x) => cats[x] ?? "") } : axis, { ...axis, size: 64 }],
    series: [{}, ...labels.map((label, i) => ({
      label, stroke: PALETTE[i % PALETTE.length], width: opts.points ? 0 : 1.5, spanGaps: !opts.points,
      points: { show: !!opts.points, size: 8, fill: PALETTE[i % PALETTE.length] },
      ...(opts.points ? { paths: () => null } : {}),
    }))],
  };
  const u = new uPlot(o, [[], ...labels.map(() => [])] as uPlot.AlignedData, el);
  return { setData: (d) => u.setData(d as uPlot.AlignedData), destroy: () => u.destroy() };
}
