import { describe, expect, it, vi } from "vitest";
vi.hoisted(() => {
  // jsdom has no matchMedia (uPlot reads the pixel ratio on import) and no 2D canvas: a no-op one.
  window.matchMedia = (() => ({ matches: false, addEventListener() {}, removeEventListener() {} })) as any;
  const ctx: any = new Proxy({}, { get: (_t, k) => (k === "measureText" ? () => ({ width: 10 }) : () => {}), set: () => true });
  HTMLCanvasElement.prototype.getContext = (() => ctx) as any;
  (globalThis as any).Path2D = class { moveTo() {} lineTo() {} rect() {} arc() {} closePath() {} bezierCurveTo() {} addPath() {} };
});
import { agoLabel, heatMap, lineChart, stackedBars } from "./charts";
import { heatColor, heatGrid, stackUsage } from "./usage-data";

describe("chart legend", () => {
  it("names each series and has no 'Time: --' / 'Value: --' rows", async () => {
    for (const labels of [["utilization", "memory"], ["utilization"]]) {
      const el = document.createElement("div");
      document.body.append(el);
      const c = lineChart(el, 360, 140, labels);
      c.setData([[1, 2], ...labels.map(() => [10, 20])] as any);
      await new Promise((r) => setTimeout(r, 0));
      const legend = el.querySelector(".u-legend")!.textContent!;
      expect(legend).toBe(labels.join(""));
      c.destroy();
    }
  });
});

describe("live charts", () => {
  it("read their x axis back from now, so it never moves", () => {
    expect([0, -30, -60, -300].map(agoLabel)).toEqual(["now", "−30s", "−1m", "−5m"]);
  });
});

describe("usage charts", () => {
  const day = 86_400_000, d0 = 20_000 * day;
  it("stack each user's GPU-hours per bucket, with empty buckets as 0 and the biggest user at the bottom", () => {
    const s = stackUsage([{ start: d0, user: "ada", gpu_hours: 1 }, { start: d0, user: "bob", gpu_hours: 4 }, { start: d0 + 2 * day, user: "ada", gpu_hours: 2 }], d0 + 1000, d0 + 3 * day, day);
    expect(s.x).toEqual([d0 / 1000, (d0 + day) / 1000, (d0 + 2 * day) / 1000]);
    expect(s.users).toEqual(["bob", "ada"]);
    expect(s.values).toEqual([[4, 0, 0], [1, 0, 2]]);
    expect(s.stacked).toEqual([[4, 0, 0], [5, 0, 2]]);
    // Buckets start at local midnight: UTC+2 shifts them two hours earlier.
    expect(stackUsage([], d0, d0 + day, day, 120).x[0]).toBe((d0 - 2 * 3_600_000) / 1000);
  });
  it("grid utilization by day and hour, empty cells null, and colour it by use", () => {
    const g = heatGrid([{ day: d0, hour: 9, utilization: 80 }, { day: d0 + day, hour: 23, utilization: 5 }, { day: d0 - 5 * day, hour: 1, utilization: 50 }], d0, d0 + 2 * day);
    expect(g.days).toEqual([d0, d0 + day]);
    expect(g.cells[0][9]).toBe(80);
    expect(g.cells[1][23]).toBe(5);
    expect(g.cells.flat().filter((c) => c !== null)).toHaveLength(2);
    expect(heatColor(null)).toContain("0.08");
    expect(heatColor(100)).toBe("rgba(47,111,222,1.00)");
    expect(heatColor(0)).toBe("rgba(47,111,222,0.06)");
  });
  it("draw with uPlot: the stacked bars name each user in the legend, the heat map has its hour axis", async () => {
    const el = document.createElement("div");
    document.body.append(el);
    const s = stackUsage([{ start: d0, user: "ada", gpu_hours: 1 }, { start: d0, user: "bob", gpu_hours: 4 }], d0, d0 + day, day);
    const c = stackedBars(el, 400, 200, s, (t) => String(t));
    await new Promise((r) => setTimeout(r, 0));
    expect(el.querySelector(".u-legend")!.textContent).toBe("adabob");
    c.destroy();
    const hm = document.createElement("div");
    document.body.append(hm);
    const m = heatMap(hm, 400, 200, heatGrid([{ day: d0, hour: 9, utilization: 80 }], d0, d0 + day), (t) => String(t));
    await new Promise((r) => setTimeout(r, 0));
    expect(hm.querySelector(".uplot")).not.toBeNull();
    m.destroy();
  });
});
