import { describe, expect, it } from "vitest";
import { efficiencyRows, fmtNum, num, overlay, paramPoints, paramsTable, seriesXY, sweepRanking } from "./results-data";
import type { CompareRow, MetricSeries, Num } from "./types";

function series(name: string, pts: [number, Num, number][]): MetricSeries {
  return {
    name, goal: "min", source: "file", last: pts[pts.length - 1][1], last_step: pts[pts.length - 1][0], best: null, best_step: null, count: pts.length,
    points: pts.map(([step, value, attempt]) => ({ step, at: 0, value, attempt })),
  };
}

function row(job_id: number, params: Record<string, string>, last: Record<string, Num>, hidden = false): CompareRow {
  return { job_id, name: `sweep[${job_id}]`, owner: "ada", state: "succeeded", started_at: 0, finished_at: 1, duration_ms: 1, gpu_hours: 0, attempts: 1, hidden, params, last, best: {} };
}

describe("results data", () => {
  it("reads NaN and infinities off the wire and prints them as the CLI does", () => {
    expect(num("NaN")).toBeNaN();
    expect(num("-Infinity")).toBe(-Infinity);
    expect([fmtNum(0.23150001), fmtNum("NaN"), fmtNum("Infinity"), fmtNum(1e-7), fmtNum(2), fmtNum(null)]).toEqual(["0.2315", "NaN", "inf", "1.0000e-7", "2", "–"]);
  });

  it("joins attempts on one step axis: a resumed run continues, a restarted one is drawn after", () => {
    // Attempt 1 logs steps 0..2; attempt 2 resumed from a checkpoint at step 2 and goes on.
    const resumed = seriesXY(series("loss", [[0, 1, 1], [1, 0.8, 1], [2, 0.7, 1], [3, 0.6, 2], [4, "NaN", 2]]));
    expect(resumed.x).toEqual([0, 1, 2, 3, 4]);
    expect(resumed.y).toEqual([1, 0.8, 0.7, 0.6, null]);
    expect(resumed.attemptStarts).toEqual([0, 3]);
    // Attempt 2 started over from step 0 (no checkpoint): after attempt 1, not on top of it.
    const restarted = seriesXY(series("loss", [[0, 1, 1], [1, 0.9, 1], [0, 1, 2], [1, 0.5, 2]]));
    expect(restarted.x).toEqual([0, 1, 2, 3]);
    expect(restarted.attemptStarts).toEqual([0, 2]);
  });

  it("overlays runs on the union of their steps, with gaps where a run has no point", () => {
    const o = overlay([
      { label: "#1", series: series("loss", [[0, 1, 1], [10, 0.5, 1]]) },
      { label: "#2", series: series("loss", [[0, 2, 1], [5, 1.5, 1]]) },
      { label: "#3", series: undefined },
    ]);
    expect(o.labels).toEqual(["#1", "#2", "#3"]);
    expect(o.data).toEqual([[0, 5, 10], [1, null, 0.5], [2, 1.5, null], [null, null, null]]);
  });

  it("puts the params that differ first and marks them", () => {
    const t = paramsTable({
      rows: [row(1, { lr: "0.1", bs: "32", opt: "adam" }, {}), row(2, { lr: "0.01", bs: "32" }, {}), row(3, {}, {}, true)],
      params: ["bs", "lr", "opt"],
      differing: ["lr", "opt"],
    });
    expect(t).toEqual([
      { name: "lr", differs: true, values: ["0.1", "0.01", "hidden"] },
      { name: "opt", differs: true, values: ["adam", "–", "hidden"] },
      { name: "bs", differs: false, values: ["32", "32", "hidden"] },
    ]);
  });

  it("ranks a sweep best first by the metric's goal, runs without a finite value last", () => {
    const rows = [row(1, { lr: "0.1" }, { loss: 0.5, acc: 0.7 }), row(2, { lr: "0.01" }, { loss: 0.2, acc: 0.9 }), row(3, { lr: "1" }, { loss: "NaN" }), row(4, { lr: "0.001" }, { loss: 0.3, acc: 0.8 })];
    const byLoss = sweepRanking(rows, "loss", "min");
    expect(byLoss.rows.map((r) => r.job_id)).toEqual([2, 4, 1, 3]);
    expect(byLoss.best).toBe(2);
    expect(sweepRanking(rows, "acc", "max").rows.map((r) => r.job_id)).toEqual([2, 4, 1, 3]);
    expect(sweepRanking([row(5, {}, { loss: "NaN" })], "loss", "min").best).toBeNull();
  });

  it("plots a numeric param on its values and any other on its categories, without diverged runs", () => {
    const rows = [row(1, { lr: "0.1", opt: "sgd" }, { loss: 0.5 }), row(2, { lr: "0.01", opt: "adam" }, { loss: 0.2 }), row(3, { lr: "1", opt: "sgd" }, { loss: "NaN" })];
    expect(paramPoints(rows, "lr", "loss")).toEqual({ x: [0.01, 0.1], y: [0.2, 0.5], ids: [2, 1], categories: null });
    expect(paramPoints(rows, "opt", "loss")).toEqual({ x: [0, 1], y: [0.5, 0.2], ids: [1, 2], categories: ["sgd", "adam"] });
  });

  it("words a run's efficiency as gantry show does", () => {
    expect(efficiencyRows({ cpu: 0.25, cpus_held: 8, cpus_used: 2, ram_peak: 3 * 2 ** 30, ram_held: 32 * 2 ** 30, gpu_util: 0.12, gpu_shared: true, gpu_memory_peak: 6.1 * 2 ** 30, gpu_memory_simulated: false, gpu_memory_total: 80 * 2 ** 30, measured_ms: 1, advice: [] })).toEqual([
      ["CPU", "25% (2.00 of 8 CPUs held)"],
      ["RAM", "peak 3.0 GiB of 32.0 GiB held"],
      ["GPU busy", "12% of the time (its GPU ran other jobs too)"],
      ["GPU memory", "peak 6.1 GiB of 80.0 GiB"],
    ]);
    expect(efficiencyRows({ cpus_held: 0.5, gpu_shared: false, gpu_memory_simulated: false, measured_ms: 0, advice: [] })).toEqual([
      ["CPU", "not measured (0.5 CPUs held)"],
      ["RAM", "not measured"],
    ]);
  });
});
