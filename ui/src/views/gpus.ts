// GPUs view: one card per GPU with live utilization/memory chart and who holds it.
import type { Backend } from "../backend";
import { lineChart, type Chart } from "../charts";
import { h, clear, type View } from "../dom";
import { bytes } from "../format";
import { SeriesStore } from "../series";
import type { GpuSample, GpuStatus, QueueEntry } from "../types";

export interface Holder { label: string; mine: boolean }

/** Who holds each GPU: Gantry jobs (owner/name) and processes outside Gantry. */
export function holdersOf(status: GpuStatus, queue: QueueEntry[], me: number | null): Map<number, Holder[]> {
  const out = new Map<number, Holder[]>();
  for (const [gpu, jobs] of status.holders) {
    out.set(gpu, jobs.map((id) => {
      const e = queue.find((q) => q.job.id === id);
      return { label: e ? `${e.job.owner} · ${e.job.name} (#${id})` : `job #${id}`, mine: !!e && e.job.owner_uid === me };
    }));
  }
  for (const g of status.gpus) {
    const outside = g.processes.filter((p) => !p.container_id).length;
    if (outside > 0) out.set(g.index, [...(out.get(g.index) ?? []), { label: `${outside} process(es) outside Gantry`, mine: false }]);
  }
  return out;
}

export function gpusView(backend: Backend, me: number | null): View {
  const el = h("section", { class: "view", "data-testid": "view-gpus" });
  const series = new SeriesStore();
  let minutes = 5;
  let charts: Chart[] = [];
  let cards: { util: HTMLElement; mem: HTMLElement; bar: HTMLElement; extra: HTMLElement; holders: HTMLElement }[] = [];
  let status: GpuStatus | null = null;
  let queue: QueueEntry[] = [];
  let stop: (() => void) | null = null;
  let disposed = false;

  const picker = h("div", { class: "segmented", role: "group", "aria-label": "Chart window" },
    [5, 15, 60].map((m) => h("button", { class: m === minutes ? "on" : "", "data-minutes": m, onclick: () => { minutes = m; picker.querySelectorAll("button").forEach((b) => b.classList.toggle("on", b.dataset.minutes === String(m))); redraw(); } }, `${m} min`)));
  const grid = h("div", { class: "gpu-grid" });
  el.append(h("div", { class: "toolbar" }, h("h2", {}, "GPUs"), picker), grid);

  function redraw() {
    const now = Date.now();
    charts.forEach((c, i) => c.setData(series.window(i, minutes, now)));
  }

  function fill(gpus: GpuSample[]) {
    const hold = status ? holdersOf({ ...status, gpus }, queue, me) : new Map();
    gpus.forEach((g, i) => {
      const c = cards[i];
      if (!c) return;
      c.util.textContent = `${g.utilization}%`;
      c.mem.textContent = `${bytes(g.memory_used)} / ${bytes(g.memory_total)}`;
      c.bar.style.width = `${(100 * g.memory_used) / Math.max(1, g.memory_total)}%`;
      c.extra.textContent = [g.temperature_c !== null ? `${g.temperature_c} °C` : "", g.power_w !== null ? `${Math.round(g.power_w)} W` : ""].filter(Boolean).join(" · ");
      clear(c.holders);
      const hs: Holder[] = hold.get(g.index) ?? [];
      if (hs.length === 0) c.holders.append(h("span", { class: "muted" }, "free"));
      hs.forEach((x) => c.holders.append(h("span", { class: x.mine ? "chip mine" : "chip" }, x.label)));
    });
  }

  async function load() {
    status = await backend.gpus();
    queue = await backend.queue();
    if (disposed) return;
    series.setTotals(status.gpus);
    series.loadRecent(await backend.gpuRecent(Date.now() - 60 * 60_000));
    clear(grid);
    charts.forEach((c) => c.destroy());
    charts = [];
    cards = [];
    for (const g of status.gpus) {
      const chartEl = h("div", { class: "chart" });
      const c = {
        util: h("span", { class: "big" }), mem: h("span", {}), bar: h("div", { class: "fill" }),
        extra: h("span", { class: "muted" }), holders: h("div", { class: "holders" }),
      };
      cards.push(c);
      grid.append(h("article", { class: "card gpu", "data-testid": `gpu-${g.index}` },
        h("header", {}, h("strong", {}, `GPU ${g.index}`), h("span", { class: "muted" }, g.name), c.extra),
        h("div", { class: "row" }, h("span", {}, "Utilization "), c.util),
        h("div", { class: "row" }, h("span", {}, "Memory "), c.mem),
        h("div", { class: "bar", title: "memory used" }, c.bar),
        chartEl,
        h("div", {}, h("span", { class: "muted" }, "Held by: "), c.holders)));
      try { charts.push(lineChart(chartEl, 360, 140, ["util %", "mem %"])); } catch { /* no canvas (tests) */ }
    }
    fill(status.gpus);
    redraw();
    let lastQueue = 0;
    stop = backend.watchGpus(async (at, gpus) => {
      series.push(at, gpus);
      if (at - lastQueue > 2000) {
        lastQueue = at;
        [status, queue] = await Promise.all([backend.gpus(), backend.queue()]);
      }
      fill(gpus);
      redraw();
    });
  }
  load().catch((e) => grid.append(h("p", { class: "error" }, String(e))));
  return { el, dispose() { disposed = true; stop?.(); charts.forEach((c) => c.destroy()); } };
}
