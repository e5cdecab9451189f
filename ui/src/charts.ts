// uPlot wrapper (kept apart so view tests can run without a canvas).
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";

export interface Chart { setData(d: [number[], ...number[][]]): void; destroy(): void }

/** uPlot options for a 0–100 % chart of one or two named series. The legend names the series only: a
 * live legend would show "Time: --" and "value: --" rows until hovered (and redo DOM work on every move). */
export function chartOptions(width: number, height: number, labels: string[], css: (name: string, fallback: string) => string): uPlot.Options {
  const colors = [css("--chart-a", "#2f6fde"), css("--chart-b", "#d9822b")];
  const axis = { stroke: css("--fg-muted", "#888"), grid: { stroke: "rgba(128,128,128,0.15)" } };
  return {
    width, height,
    scales: { y: { range: [0, 100] } },
    legend: { show: true, live: false },
    cursor: { show: false },
    axes: [axis, { ...axis, values: (_u: uPlot, v: number[]) => v.map((x) => `${x}%`) }],
    series: [{}, ...labels.map((label, i) => ({ label, stroke: colors[i], width: 1.5, ...(i === 0 ? { fill: colors[i] + "22" } : {}) }))],
  };
}

export function lineChart(el: HTMLElement, width: number, height: number, labels: string[]): Chart {
  const style = getComputedStyle(document.documentElement);
  const css = (name: string, fallback: string) => style.getPropertyValue(name).trim() || fallback;
  const u = new uPlot(chartOptions(width, height, labels, css), [[], ...labels.map(() => [])], el);
  return { setData: (d) => u.setData(d), destroy: () => u.destroy() };
}
