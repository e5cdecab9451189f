import { describe, expect, it, vi } from "vitest";
vi.mock("./charts", () => ({ lineChart: () => ({ setData() {}, destroy() {} }) }));
import { historyQueryString } from "./backend";
import { appendLog, ask, bytes, duration, gpuHours } from "./format";
import { route } from "./main";
import { RAW_CAP, Ring, SeriesStore } from "./series";
import { laneBox, pagesFor, visibleSlice } from "./virtual";

describe("formatting", () => {
  it("formats sizes, durations and GPU-hours", () => {
    expect(bytes(24 * 2 ** 30)).toBe("24.0 GiB");
    expect(duration(93_784_000)).toBe("1d 2h");
    expect(duration(61_000)).toBe("1m 1s");
    expect(duration(0)).toBe("0s");
    expect(gpuHours(4, 0, 1_800_000)).toBe(2);
    expect(ask(0, null)).toBe("CPU only");
    expect(ask(2, 8 * 2 ** 30)).toBe("2 × 8.0 GiB");
  });
});

describe("virtual scrolling", () => {
  it("renders only the visible rows of 100,000", () => {
    const s = visibleSlice(30_000, 420, 30, 100_000, 10);
    expect(s.first).toBe(990);
    expect(s.last).toBe(1024);
    expect(s.padTop + (s.last - s.first + 1) * 30 + s.padBottom).toBe(100_000 * 30);
  });
  it("asks for the pages that cover the slice", () => {
    expect(pagesFor(190, 410, 200)).toEqual([0, 1, 2]);
    expect(pagesFor(5, 4, 200)).toEqual([]);
  });
  it("places timeline boxes, clipping to the period", () => {
    expect(laneBox(0, 50, 0, 100, 1000, 100)).toEqual({ x: 0, w: 500 });
    expect(laneBox(-50, 10, 0, 100, 1000, 100)).toEqual({ x: 0, w: 100 });
    expect(laneBox(50, null, 0, 100, 1000, 75)).toEqual({ x: 500, w: 250 });
    expect(laneBox(200, 300, 0, 100, 1000, 300)).toBeNull();
  });
});

describe("GPU series", () => {
  it("keeps an hour, raw for 5 minutes and min/max per 10 s bucket before, and windows by minutes", () => {
    const s = new SeriesStore();
    s.setTotals([{ memory_total: 100 }]);
    for (let t = 0; t <= 2 * 3600; t += 1) s.push(t * 1000, [{ utilization: t % 100, memory_used: 50 }]);
    // 2 h of 1 Hz samples: 301 raw (5 min) and one bucket per 10 s of the hour before (bounded).
    expect(s.size(0).raw).toBe(301);
    expect(s.size(0).buckets).toBeLessThanOrEqual(361);
    const [ts, util, mem] = s.window(0, 5, 7200_000);
    expect(ts.length).toBe(301);
    expect(util[util.length - 1]).toBe(7200 % 100);
    expect(mem[0]).toBe(50);
    const hour = s.window(0, 60, 7200_000);
    expect(hour[0].length).toBeLessThan(1000);
    expect(hour[0][0]).toBeGreaterThanOrEqual(3600 - 10);
    expect([...hour[0]].sort((a, b) => a - b)).toEqual(hour[0]); // time keeps increasing for uPlot
    s.push(1000, [{ utilization: 1, memory_used: 1 }]); // out of order: ignored
    expect(s.size(0).raw).toBe(301);
  });
  it("keeps one-second peaks and dips older than 5 minutes", () => {
    const s = new SeriesStore();
    s.setTotals([{ memory_total: 100 }, { memory_total: 100 }]);
    for (let t = 0; t <= 3000; t++) {
      const spike = t === 1234; // 30 min before the end, one sample
      s.push(t * 1000, [{ utilization: spike ? 100 : 40, memory_used: spike ? 5 : 60 }, { utilization: 7, memory_used: 0 }]);
    }
    const [ts, util, mem] = s.window(0, 60, 3000_000);
    const at = util.indexOf(100);
    expect(at).toBeGreaterThanOrEqual(0);
    expect(ts[at]).toBeGreaterThanOrEqual(1230);
    expect(ts[at]).toBeLessThan(1240);
    expect(Math.min(...mem)).toBe(5);
    expect(Math.min(...util)).toBe(40);
    expect(s.window(1, 60, 3000_000)[1].every((u) => u === 7)).toBe(true);
  });
  it("bounds memory when the engine samples fast", () => {
    const s = new SeriesStore();
    s.setTotals([{ memory_total: 100 }]);
    for (let t = 0; t < 100 * 300; t++) s.push(t * 10, [{ utilization: t === 5000 ? 99 : 1, memory_used: 0 }]); // 100 Hz for 5 min
    expect(s.size(0).raw).toBeLessThanOrEqual(RAW_CAP);
    expect(s.size(0).buckets).toBeLessThanOrEqual(31);
    expect(s.window(0, 60, 300_000)[1]).toContain(99);
  });
});

describe("ring buffer", () => {
  it("keeps the newest rows in order and overwrites the oldest when full", () => {
    const r = new Ring(3, 2);
    for (let i = 1; i <= 5; i++) r.push(i, i * 10);
    expect(r.len).toBe(3);
    expect([0, 1, 2].map((i) => [r.at(i, 0), r.at(i, 1)])).toEqual([[3, 30], [4, 40], [5, 50]]);
    r.shift();
    r.push(6, 60);
    expect([0, 1, 2].map((i) => r.at(i, 0))).toEqual([4, 5, 6]);
    r.shift(); r.shift(); r.shift(); r.shift();
    expect(r.len).toBe(0);
  });
});

describe("routing and queries", () => {
  it("routes hashes to views", () => {
    expect(route("#/run/42")).toEqual({ tab: "run", id: 42 });
    expect(route("#/history")).toEqual({ tab: "history" });
    expect(route("#/usage")).toEqual({ tab: "usage" });
    expect(route("#/nope")).toEqual({ tab: "gpus" });
  });
  it("drops empty filters from the query string", () => {
    expect(historyQueryString({ user: "ada", text: "", status: undefined, limit: 200, asc: false })).toBe("user=ada&limit=200&asc=false");
  });
});

import { recentChartData, runChartData } from "./views/run";
describe("run chart data", () => {
  it("averages the run's GPUs over its period", () => {
    const rows: [number, [number, number][]][] = [[1000, [[10, 0], [30, 0], [99, 0]]], [2000, [[20, 0], [40, 0], [99, 0]]], [9000, [[0, 0], [0, 0], [0, 0]]]];
    expect(recentChartData(rows, [0, 1], 0, 5000)).toEqual([[1, 2], [20, 30], [0, 0]]);
    expect(runChartData([[[60_000, 50, 0]], [[60_000, 100, 0], [120_000, 20, 0]]])).toEqual([[60, 120], [75, 20], [0, 0]]);
  });
});

describe("a followed log", () => {
  it("draws a progress bar's next state over the last one instead of a new line per update", () => {
    let t = appendLog("", "start\n 10%\r");
    t = appendLog(t, " 50%\r");
    expect(t).toBe("start\n 50%\r");
    t = appendLog(t, "100%\ndone\n");
    expect(t).toBe("start\n100%\ndone\n");
    expect(appendLog("a\n", "b\n")).toBe("a\nb\n");
  });
});
