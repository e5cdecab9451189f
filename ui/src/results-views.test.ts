import { describe, expect, it, vi } from "vitest";
const drawn = vi.hoisted(() => ({ xy: [] as { labels: string[]; data: unknown }[] }));
vi.mock("./charts", () => ({
  lineChart: () => ({ setData() {}, destroy() {} }),
  xyChart: (_el: unknown, _w: number, _h: number, labels: string[]) => {
    const c = { labels, data: null as unknown };
    drawn.xy.push(c);
    return { setData(d: unknown) { c.data = d; }, destroy() {} };
  },
}));
import { fakeBackend, settle } from "./fake-backend";
import { compareQuery, compareView } from "./views/compare";
import { efficiencyBox } from "./views/run";
import { sweepOf, historyView } from "./views/history";
import { efficiencyTables } from "./views/usage";
import { route } from "./main";
import type { CompareRow, Comparison, JobResults, MetricSeries } from "./types";

function series(name: string, values: number[]): MetricSeries {
  return { name, goal: "min", source: "file", last: values[values.length - 1], last_step: values.length - 1, best: null, best_step: null, count: values.length,
    points: values.map((value, step) => ({ step, at: 0, value, attempt: 1 })) };
}
function results(job_id: number, loss: number[]): JobResults {
  return { job_id, metrics: [series("loss", loss)], params: {}, param_sources: {}, tags: {}, ingest: { garbage_lines: 0, bad_records: 0, bytes_read: 0, bytes_limit_reached: false, bytes_unread: 0, dropped_points: 0, dropped_names: 0, notes: [] } };
}
function row(job_id: number, lr: string, loss: number): CompareRow {
  return { job_id, name: `sweep[lr=${lr}]`, owner: "ada", state: "succeeded", started_at: 0, finished_at: 60_000, duration_ms: 60_000, gpu_hours: 0.02, attempts: 1, hidden: false,
    params: { lr, bs: "32" }, last: { loss }, best: { loss } };
}

describe("results views", () => {
  it("routes compare by ids and by a sweep's name", () => {
    expect(route("#/compare/ids/3,4")).toEqual({ tab: "compare", arg: "ids/3,4" });
    expect(compareQuery("ids/3,4")).toEqual({ ids: "3,4" });
    expect(compareQuery("name/sweep%5Bx%5D")).toEqual({ name: "sweep[x]" });
    expect(sweepOf("sweep[lr=0.1]")).toBe("sweep");
    expect(sweepOf("train")).toBeNull();
  });

  it("compares ticked runs: best marked first, varied params highlighted, curves overlaid, each param plotted", async () => {
    const c: Comparison = { rows: [row(3, "0.1", 0.5), row(4, "0.01", 0.2), row(5, "1", 0.9)], params: ["bs", "lr"], differing: ["lr"], metrics: [{ name: "loss", goal: "min" }], sort: { name: "loss", goal: "min" } };
    const { b, calls } = fakeBackend({
      compare: (q) => { calls.push({ name: "compare", args: [q] }); return Promise.resolve(c); },
      jobResults: (id) => Promise.resolve(results(id, id === 4 ? [1, 0.5, 0.2] : [1, 0.9])),
    });
    drawn.xy = [];
    const v = compareView(b, "ids/3,4,5", () => {});
    await settle(10);
    expect(calls.find((x) => x.name === "compare")!.args[0]).toEqual({ ids: "3,4,5" });
    const rows = [...v.el.querySelectorAll("[data-testid=compare-rows] tbody tr")];
    expect(rows.map((r) => r.getAttribute("data-testid"))).toEqual(["compare-row-4", "compare-row-3", "compare-row-5"]);
    expect(rows[0].classList.contains("best")).toBe(true);
    expect(rows[0].textContent).toContain("★ 4");
    const params = [...v.el.querySelectorAll("[data-testid=compare-params] tbody tr")];
    expect(params.map((p) => [p.firstChild!.textContent, p.getAttribute("data-differs")])).toEqual([["lr", "true"], ["bs", "false"]]);
    const curve = v.el.querySelector("[data-testid=compare-curve-loss]")!;
    expect(curve.getAttribute("data-runs")).toBe("3");
    expect(curve.getAttribute("data-points")).toBe("3");
    expect(drawn.xy[0].labels).toEqual(["#3", "#4", "#5"]);
    expect(v.el.querySelector("[data-testid=compare-param-lr]")!.getAttribute("data-points")).toBe("3");
  });

  it("ticks history rows and opens Compare with them", async () => {
    const went: string[] = [];
    const { b } = fakeBackend();
    const v = historyView(b, (hash) => went.push(hash));
    document.body.append(v.el);
    await settle(10);
    const btn = v.el.querySelector("[data-testid=history-compare]") as HTMLButtonElement;
    expect(btn.disabled).toBe(true);
    const ticks = [...v.el.querySelectorAll<HTMLInputElement>("[data-testid^=history-tick-]")].slice(0, 2);
    ticks.forEach((t) => t.click());
    expect(btn.disabled).toBe(false);
    btn.click();
    const ids = ticks.map((t) => Number(t.dataset.testid!.replace("history-tick-", ""))).sort((a, b) => a - b);
    expect(went).toEqual([`#/compare/ids/${ids.join(",")}`]);
    v.el.remove();
  });

  it("shows a run's efficiency with its advice", () => {
    const el = efficiencyBox({ cpu: 0.16, cpus_held: 8, cpus_used: 1.3, gpu_util: 0.12, gpu_shared: false, gpu_memory_peak: 6 * 2 ** 30, gpu_memory_simulated: false, gpu_memory_total: 80 * 2 ** 30, measured_ms: 600_000,
      advice: ["held 8 CPUs, used 1.3: declare `cpus: 2` and the rest can run other jobs"] });
    expect(el.textContent).toContain("16% (1.30 of 8 CPUs held)");
    expect(el.querySelector("[data-testid=run-advice]")!.textContent).toBe("held 8 CPUs, used 1.3: declare `cpus: 2` and the rest can run other jobs");
    expect(efficiencyBox(null).textContent).toContain("Not measured yet");
  });

  it("words the usage efficiency per user and per day", () => {
    const t = efficiencyTables({ since_ms: 0, until_ms: 1, users: [{ user: "ada", gpu_hours_held: 10, gpu_hours_used: 6.5, gpu_hours_unmeasured: 0, cpu: 0.42, runs: 3 }], days: [{ start: 0, gpu_hours_held: 10, gpu_hours_used: 6.5 }] }, () => "Mon");
    expect(t.users).toEqual([["ada", "3", "10.00", "6.50", "65%", "42%"]]);
    expect(t.days).toEqual([["Mon", "10.00", "6.50", "65%"]]);
  });
});
