// uPlot wrapper (kept apart so view tests can run without a canvas).
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";

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
