import { describe, expect, it, vi } from "vitest";
vi.hoisted(() => {
  // jsdom has no matchMedia (uPlot reads the pixel ratio on import) and no 2D canvas: a no-op one.
  window.matchMedia = (() => ({ matches: false, addEventListener() {}, removeEventListener() {} })) as any;
  const ctx: any = new Proxy({}, { get: (_t, k) => (k === "measureText" ? () => ({ width: 10 }) : () => {}), set: () => true });
  HTMLCanvasElement.prototype.getContext = (() => ctx) as any;
  (globalThis as any).Path2D = class { moveTo() {} lineTo() {} rect() {} arc() {} closePath() {} bezierCurveTo() {} addPath() {} };
});
import { agoLabel, lineChart } from "./charts";

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
