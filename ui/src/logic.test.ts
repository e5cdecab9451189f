import { describe, expect, it, vi } from "vitest";
vi.mock("./charts", () => ({ lineChart: () => ({ setData() {}, destroy() {} }) }));
import { historyQueryString } from "./backend";
import { ask, bytes, duration, gpuHours } from "./format";
import { route } from "./main";
import { SeriesStore } from "./series";
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
  it("keeps an hour and windows by minutes", () => {
    const s = new SeriesStore(60 * 60_000);
    s.setTotals([{ memory_total: 100 }]);
    for (let t = 0; t <= 2 * 3600; t += 1) s.push(t * 1000, [{ utilization: t % 100, memory_used: 50 }]);
    expect(s.ts.length).toBe(3601);
    const [ts, util, mem] = s.window(0, 5, 7200_000);
    expect(ts.length).toBe(301);
    expect(util[util.length - 1]).toBe(7200 % 100);
    expect(mem[0]).toBe(50);
    s.push(1000, [{ utilization: 1, memory_used: 1 }]); // out of order: ignored
    expect(s.ts.length).toBe(3601);
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
