// Usage view: per user GPU-hours, jobs and mean wait over a window, and the decayed usage fair share
// orders the queue by (the same numbers as `gantry usage`).
import type { Backend } from "../backend";
import { heatMap, stackedBars, type Chart } from "../charts";
import { heatGrid, stackUsage, type Heat } from "../usage-data";
import { h, type View } from "../dom";
import { duration } from "../format";
import type { EfficiencyReport, UsageReport } from "../types";

/** The window selector: label and length. 7 d first shown, as `gantry usage` defaults to it. */
export const WINDOWS: [string, number][] = [["24 h", 24 * 3_600_000], ["7 d", 7 * 86_400_000], ["30 d", 30 * 86_400_000]];
export const DEFAULT_WINDOW = "7 d";

export interface UsageRow { user: string; gpuHours: string; jobs: string; wait: string; fairShare: string; preempted: string; mine: boolean }

/** Table rows in the engine's order (most GPU-hours first); `me` is the caller's user name. */
export function usageRows(r: UsageReport, me: string | null): UsageRow[] {
  return r.users.map((u) => ({
    user: u.user, gpuHours: u.gpu_hours.toFixed(2), jobs: String(u.jobs_finished), wait: duration(u.mean_wait_ms),
    fairShare: u.fair_share_usage.toFixed(2), preempted: (u.gpu_hours_preempted ?? 0).toFixed(2), mine: u.user === me,
  }));
}

/** The efficiency tables' rows: per user, then per local day (held, used, used ÷ measured held, CPU). */
export function efficiencyTables(r: EfficiencyReport, day: (t: number) => string): { users: string[][]; days: string[][] } {
  const share = (used: number, held: number) => (held > 0 ? `${Math.round((used / held) * 100)}%` : "–");
  return {
    users: r.users.map((u) => [u.user, String(u.runs), u.gpu_hours_held.toFixed(2), u.gpu_hours_used.toFixed(2), share(u.gpu_hours_used, u.gpu_hours_held - u.gpu_hours_unmeasured), u.cpu != null ? `${Math.round(u.cpu * 100)}%` : "–"]),
    days: r.days.map((d) => [day(d.start), d.gpu_hours_held.toFixed(2), d.gpu_hours_used.toFixed(2), share(d.gpu_hours_used, d.gpu_hours_held)]),
  };
}

/** One line under the table: what the fair-share column means and how fast it fades. */
export function fairShareLine(halfLifeMs: number): string {
  return `Fair share: among jobs of equal priority, the user with the least recent use starts first; `
    + `recent use is GPU-hours, each job's halved every ${duration(halfLifeMs)} since it ended.`;
}

/** The stacked chart's bucket for a window: hours for the last day, days beyond. */
export function bucketFor(spanMs: number): number {
  return spanMs <= 86_400_000 ? 3_600_000 : 86_400_000;
}

/** The heat map's one-line summary (and its text for screen readers): the busiest hour of day. */
export function heatSummary(g: Heat): string {
  const sum = new Array(24).fill(0), n = new Array(24).fill(0);
  for (const row of g.cells) row.forEach((v, i) => { if (v !== null) { sum[i] += v; n[i]++; } });
  let best = -1;
  for (let i = 0; i < 24; i++) if (n[i] > 0 && (best < 0 || sum[i] / n[i] > sum[best] / n[best])) best = i;
  if (best < 0) return "No GPU samples in this window.";
  return `Busiest hour of the day: ${String(best).padStart(2, "0")}:00, ${(sum[best] / n[best]).toFixed(0)} % mean GPU utilization.`;
}

export function usageView(backend: Backend, me: string | null): View {
  const el = h("section", { class: "view usage", "data-testid": "view-usage" });
  let windowLabel = DEFAULT_WINDOW;
  let disposed = false;
  let unlisten: (() => void) | null = null;
  let seq = 0;
  const picker = h("div", { class: "segmented", role: "group", "aria-label": "Usage window" },
    WINDOWS.map(([label]) => h("button", { class: label === windowLabel ? "on" : "", "data-window": label, onclick: () => { windowLabel = label; load(); } }, label)));
  const period = h("span", { class: "muted", "data-testid": "usage-period" });
  const body = h("tbody", {});
  const table = h("table", { class: "grid", "data-testid": "usage-table" },
    h("thead", {}, h("tr", {}, ["User", "GPU-hours", "Jobs finished", "Mean wait", "Fair share", "GPU-hours preempted"].map((c) => h("th", {}, c)))), body);
  const empty = h("p", { class: "muted", hidden: true, "data-testid": "usage-empty" }, "No GPU use in this window.");
  const explain = h("p", { class: "muted", "data-testid": "usage-fair-share" });
  const barsEl = h("div", { class: "chart", "data-testid": "usage-stacked", role: "img", "aria-label": "GPU-hours per user" });
  const heatEl = h("div", { class: "chart", "data-testid": "usage-heat", role: "img", "aria-label": "GPU utilization by hour of day" });
  const heatText = h("p", { class: "muted", "data-testid": "usage-heat-summary" });
  const effUsers = h("tbody", {});
  const effDays = h("tbody", {});
  const effNote = h("p", { class: "muted", "data-testid": "usage-efficiency-note" });
  const effEl = h("div", { "data-testid": "usage-efficiency" },
    h("h3", {}, "Efficiency: GPU-hours held vs used"),
    h("table", { class: "grid" }, h("thead", {}, h("tr", {}, ["User", "Runs", "GPU-h held", "GPU-h used", "Used", "CPU efficiency"].map((c) => h("th", {}, c)))), effUsers),
    h("table", { class: "grid" }, h("thead", {}, h("tr", {}, ["Day", "GPU-h held", "GPU-h used", "Used"].map((c) => h("th", {}, c)))), effDays),
    effNote);
  el.append(h("div", { class: "toolbar" }, h("h2", {}, "Usage"), picker, period), table, empty, explain,
    h("h3", {}, "GPU-hours per user"), barsEl, h("h3", {}, "GPU utilization by hour of day"), heatEl, heatText, effEl);
  let charts: Chart[] = [];
  const tz = -new Date().getTimezoneOffset();
  const fmt = (o: Intl.DateTimeFormatOptions) => (t: number) => new Date(t).toLocaleString(undefined, o);

  async function loadCharts(span: number, mine: number) {
    const bucket = bucketFor(span);
    const c = await backend.usageCharts(Date.now() - span, bucket, tz);
    if (disposed || mine !== seq) return;
    charts.forEach((ch) => ch.destroy());
    charts = [];
    barsEl.replaceChildren();
    heatEl.replaceChildren();
    const stacked = stackUsage(c.buckets, c.since_ms, c.until_ms, c.bucket_ms, tz);
    const grid = heatGrid(c.heat, c.since_ms, c.until_ms, tz);
    barsEl.dataset.users = stacked.users.join(",");
    barsEl.dataset.buckets = String(stacked.x.length);
    heatEl.dataset.days = String(grid.days.length);
    heatText.textContent = heatSummary(grid);
    const width = Math.max(320, el.clientWidth - 32 || 720);
    const label = bucket < 86_400_000 ? fmt({ hour: "2-digit", minute: "2-digit" }) : fmt({ month: "short", day: "numeric" });
    try {
      charts.push(stackedBars(barsEl, width, 220, stacked, label, c.bucket_ms));
      charts.push(heatMap(heatEl, width, Math.min(420, 40 + 18 * grid.days.length), grid, fmt({ weekday: "short", month: "short", day: "numeric" })));
    } catch { /* no canvas (tests) */ }
  }

  async function loadEfficiency(span: number, mine: number) {
    const r = await backend.usageEfficiency(Date.now() - span, tz);
    if (disposed || mine !== seq) return;
    const t = efficiencyTables(r, fmt({ weekday: "short", month: "short", day: "numeric" }));
    effUsers.replaceChildren(...t.users.map((cells) => h("tr", { "data-testid": `usage-eff-${cells[0]}` }, cells.map((c, i) => h("td", { class: i ? "num" : "" }, c)))));
    effDays.replaceChildren(...t.days.map((cells) => h("tr", {}, cells.map((c, i) => h("td", { class: i ? "num" : "" }, c)))));
    effNote.textContent = "Used: GPU-hours weighted by each run's mean GPU utilization (the 1 Hz samples), as a share of the GPU-hours held that were measured. CPU efficiency: CPU time ÷ (CPUs held × time), from each job's cgroup.";
  }

  async function load() {
    picker.querySelectorAll("button").forEach((b) => b.classList.toggle("on", b.dataset.window === windowLabel));
    const mine = ++seq;
    const span = WINDOWS.find(([l]) => l === windowLabel)![1];
    loadEfficiency(span, mine).catch((e) => { if (!disposed && mine === seq) effNote.textContent = `Could not read the efficiency: ${e}`; });
    loadCharts(span, mine).catch((e) => { if (!disposed && mine === seq) heatText.textContent = `Could not read the charts: ${e}`; });
    try {
      const r = await backend.usage(Date.now() - span);
      // A newer window choice (or a job event) superseded this answer.
      if (disposed || mine !== seq) return;
      const rows = usageRows(r, me);
      body.replaceChildren(...rows.map((u) => h("tr", { class: u.mine ? "mine" : "", "data-testid": `usage-row-${u.user}`, "aria-current": u.mine ? "true" : null },
        h("td", {}, u.user, u.mine ? h("span", { class: "muted" }, " (you)") : null),
        h("td", { class: "num" }, u.gpuHours), h("td", { class: "num" }, u.jobs), h("td", { class: "num" }, u.wait), h("td", { class: "num" }, u.fairShare), h("td", { class: "num" }, u.preempted))));
      table.hidden = rows.length === 0;
      empty.textContent = "No GPU use in this window.";
      empty.hidden = rows.length > 0;
      period.textContent = `last ${windowLabel}`;
      explain.textContent = fairShareLine(r.fair_share_half_life_ms);
    } catch (e) {
      if (!disposed && mine === seq) { period.textContent = ""; empty.hidden = false; empty.textContent = `Could not read usage: ${e}`; }
    }
  }
  load();
  // A job that ends changes the numbers: re-read while the view is open.
  backend.onJobChanged(() => { load(); }).then((u) => { if (disposed) u(); else unlisten = u; });
  return { el, dispose() { disposed = true; unlisten?.(); charts.forEach((c) => c.destroy()); } };
}
