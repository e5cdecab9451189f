// uPlot wrapper (kept apart so view tests can run without a canvas).
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";

export interface Chart { setData(d: [number[], number[], number[]]): void; destroy(): void }

export function lineChart(el: HTMLElement, width: number, height: number, labels: [string, string]): Chart {
  const css = getComputedStyle(document.documentElement);
  const a = css.getPropertyValue("--chart-a").trim() || "#2f6fde";
  const b = css.getPropertyValue("--chart-b").trim() || "#d9822b";
  const axis = { stroke: css.getPropertyValue("--fg-muted").trim() || "#888", grid: { stroke: "rgba(128,128,128,0.15)" } };
  const u = new uPlot(
    {
      width, height,
      scales: { y: { range: [0, 100] } },
      legend: { show: true },
      axes: [axis, { ...axis, values: (_u: uPlot, v: number[]) => v.map((x) => `${x}%`) }],
      series: [{}, { label: labels[0], stroke: a, width: 1.5, fill: a + "22" }, { label: labels[1], stroke: b, width: 1.5 }],
    },
    [[], [], []],
    el,
  );
  return { setData: (d) => u.setData(d), destroy: () => u.destroy() };
}
