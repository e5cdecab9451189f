// GPUs view: one card per GPU with live utilization/memory chart and who holds it.
import type { Backend } from "../backend";
import { lineChart, type Chart } from "../charts";
import { h, clear, type View } from "../dom";
import { bytes } from "../format";
import { HOUR_MS, gpuSeries, steadyKey } from "../series";
import { idleFor } from "../sessions";
import type { GpuSample, GpuStatus, GpuUser } from "../types";

/** One line under "Held by": `job` links to the job's page. */
export interface Holder { text: string; mine: boolean; job: number | null; kind: "job" | "outside" | "reserved" | "free"; idle?: boolean }

/** How often the card's holders are re-read while the view is open (they are not in the live samples). */
export const HOLDERS_REFRESH_MS = 5_000;

/** "14:02" for today, else "2025-03-01 14:02" (local time). */
export function clock(ms: number, now = Date.now()): string {
  const d = new Date(ms);
  const pad = (n: number) => String(n).padStart(2, "0");
  const hm = `${pad(d.getHours())}:${pad(d.getMinutes())}`;
  return d.toDateString() === new Date(now).toDateString() ? hm : `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${hm}`;
}

/** "job 12 train (alice) · 3.0 GiB · since 14:02" or
 * "outside Gantry: pid 1234 python train.py (bob) in container bob-nb · 3.0 GiB · idle for 2 h 10 min"
 * (its GPU at 0 % for a minute or more, as the engine says). Plain text: the caller
 * must put it in a text node (commands and names are anyone's text). */
export function holderLine(u: GpuUser, now = Date.now()): string {
  let who: string;
  if (u.job_id !== null) {
    who = `job ${u.job_id} ${u.job_name ?? "?"} (${u.user ?? "?"})`;
  } else {
    who = "outside Gantry:";
    if (u.pid !== null) who += ` pid ${u.pid}${u.command ? ` ${u.command}` : ""}${u.user ? ` (${u.user})` : ""}`;
    // A container with no process on the GPU yet (e.g. another engine's job starting) still holds it.
    if (u.container) who += ` ${u.pid !== null ? "in container" : "container"} ${u.container}`;
    if (u.pid === null && !u.container) who = "outside Gantry";
  }
  const parts = [who];
  if (u.used_memory !== null) parts.push(bytes(u.used_memory));
  if (u.since !== null) parts.push(`since ${clock(u.since, now)}`);
  const idle = u.job_id === null ? idleFor(u.idle_since, now) : null;
  if (idle) parts.push(idle);
  return parts.join(" · ");
}

/** What each GPU card says under "Held by": "free" only when nothing at all is on the GPU. */
export function holdersOf(status: GpuStatus, me: string | null, now = Date.now()): Map<number, Holder[]> {
  const out = new Map<number, Holder[]>();
  for (const g of status.gpus) {
    const hs: Holder[] = [];
    if (status.reserved.includes(g.index)) hs.push({ text: "reserved for interactive use", mine: false, job: null, kind: "reserved" });
    for (const u of status.users.filter((u) => u.gpu === g.index)) {
      const outside = u.job_id === null;
      hs.push({ text: holderLine(u, now), mine: me !== null && u.user === me, job: u.job_id, kind: outside ? "outside" : "job", ...(outside && u.idle_since != null ? { idle: true } : {}) });
    }
    if (hs.length === 0) hs.push({ text: "free", mine: false, job: null, kind: "free" });
    out.set(g.index, hs);
  }
  return out;
}

/** Charts redraw at most this often, and only those on screen. */
export const REDRAW_MS = 1_000;

/** `me`: the caller's user name (their jobs and processes are highlighted). Samples go to the shared
 * `gpuSeries`; while the window is hidden or minimized the view stops its stream and timers, and on return
 * asks the engine only for the samples it missed. */
export function gpusView(backend: Backend, me: string | null): View {
  const el = h("section", { class: "view", "data-testid": "view-gpus" });
  const series = gpuSeries;
  let minutes = 5;
  let charts: (Chart | null)[] = [];
  /** What each chart shows, when it is a steady line (see `steadyKey`): the same key is not redrawn. */
  let drawn: (string | null)[] = [];
  let cards: { util: HTMLElement; mem: HTMLElement; bar: HTMLElement; extra: HTMLElement; holders: HTMLElement; shown: string }[] = [];
  let hold = new Map<number, Holder[]>();
  let status: GpuStatus | null = null;
  let last: GpuSample[] = [];
  let stop: (() => void) | null = null;
  let timer: ReturnType<typeof setInterval> | undefined;
  let pending: ReturnType<typeof setTimeout> | undefined;
  let drawnAt = 0;
  let unlisten: (() => void) | null = null;
  let disposed = false;
  let running = false;
  // Cards on screen (all of them where IntersectionObserver is missing, e.g. in tests).
  const onScreen = new Set<number>();
  const observer = typeof IntersectionObserver === "undefined" ? null : new IntersectionObserver((entries) => {
    for (const e of entries) {
      const i = Number((e.target as HTMLElement).dataset.card);
      if (e.isIntersecting) { onScreen.add(i); draw(i); } else onScreen.delete(i);
    }
  });

  const picker = h("div", { class: "segmented", role: "group", "aria-label": "Chart window" },
    [5, 15, 60].map((m) => h("button", { class: m === minutes ? "on" : "", "data-minutes": m, onclick: () => { minutes = m; picker.querySelectorAll("button").forEach((b) => b.classList.toggle("on", b.dataset.minutes === String(m))); onScreen.forEach((i) => draw(i)); } }, `${m} min`)));
  const grid = h("div", { class: "gpu-grid" });
  el.append(h("div", { class: "toolbar" }, h("h2", {}, "GPUs"), picker), grid);

  /** One card's numbers, holders and (with `chart`) chart, from the latest sample. */
  function draw(i: number, chart = true) {
    const c = cards[i], g = last[i];
    if (!c || !g) return;
    // Writing an unchanged text still replaces the node and makes WebKit lay out and paint again.
    const set = (el: HTMLElement, text: string) => { if (el.textContent !== text) el.textContent = text; };
    set(c.util, `${g.utilization}%`);
    set(c.mem, `${bytes(g.memory_used)} / ${bytes(g.memory_total)}`);
    const width = `${(100 * g.memory_used) / Math.max(1, g.memory_total)}%`;
    if (c.bar.style.width !== width) c.bar.style.width = width;
    set(c.extra, [g.temperature_c !== null ? `${g.temperature_c} °C` : "", g.power_w !== null ? `${Math.round(g.power_w)} W` : ""].filter(Boolean).join(" · "));
    const hs = hold.get(g.index) ?? [];
    const key = JSON.stringify(hs);
    if (key !== c.shown) {
      c.shown = key;
      clear(c.holders);
      // h() puts strings in text nodes: a process's command can never become markup.
      for (const x of hs) {
        const cls = `holder ${x.kind}${x.mine ? " mine" : ""}${x.idle ? " idle" : ""}`;
        c.holders.append(h("li", { class: cls, title: x.text },
          x.job !== null ? h("a", { href: `#/run/${x.job}`, "data-testid": `holder-job-${x.job}` }, x.text) : x.text));
      }
    }
    const ch = charts[i];
    if (chart && ch) {
      const now = Date.now() / 1000;
      const w = series.window(i, minutes, now * 1000);
      const key = steadyKey(w, now - minutes * 60, now, minutes);
      if (key === null || key !== drawn[i]) {
        // x in seconds before now: the live axis (see lineChart).
        ch.setData([w[0].map((t) => t - now), w[1], w[2]]);
        drawn[i] = key;
      }
    }
  }

  /** Redraw the cards on screen at most once per REDRAW_MS, however fast samples come. */
  function schedule() {
    if (pending !== undefined || !running) return;
    pending = setTimeout(() => {
      pending = undefined;
      if (!running) return;
      drawnAt = Date.now();
      (observer ? onScreen : new Set(cards.keys())).forEach((i) => draw(i));
    }, Math.max(0, drawnAt + REDRAW_MS - Date.now()));
  }

  /** Who holds each GPU comes only from `gpus`: re-read it on a timer and whenever a job changes state. */
  async function refreshHolders() {
    try {
      const s = await backend.gpus();
      if (disposed) return;
      status = s;
      if (!last.length) last = s.gpus;
      hold = holdersOf({ ...s, gpus: last }, me);
      (observer ? onScreen : new Set(cards.keys())).forEach((i) => draw(i, false));
    } catch { /* keep the last known holders; the next tick retries */ }
  }

  /** Catch up on missed samples, then stream; samples that arrive meanwhile are kept in order. */
  async function start() {
    if (running || disposed) return;
    running = true;
    let early: [number, GpuSample[]][] | null = [];
    stop = backend.watchGpus((at, gpus) => {
      if (early) { early.push([at, gpus]); return; }
      series.push(at, gpus);
      last = gpus;
      schedule();
    });
    timer = setInterval(refreshHolders, HOLDERS_REFRESH_MS);
    try { series.loadRecent(await backend.gpuRecent(Math.max(series.last + 1, Date.now() - HOUR_MS))); } finally {
      for (const [at, gpus] of early) { series.push(at, gpus); last = gpus; }
      early = null;
    }
    refreshHolders();
    schedule();
  }

  function pause() {
    running = false;
    stop?.();
    stop = null;
    clearInterval(timer);
    clearTimeout(pending);
    pending = undefined;
  }

  const onVisibility = () => { if (document.hidden) pause(); else start(); };

  async function load() {
    status = await backend.gpus();
    if (disposed) return;
    series.setTotals(status.gpus);
    last = status.gpus;
    hold = holdersOf(status, me);
    clear(grid);
    charts.forEach((c) => c?.destroy());
    charts = [];
    drawn = [];
    cards = [];
    for (const g of status.gpus) {
      const chartEl = h("div", { class: "chart" });
      const c = {
        util: h("span", { class: "big" }), mem: h("span", {}), bar: h("div", { class: "fill" }),
        extra: h("span", { class: "muted" }), holders: h("ul", { class: "holders", "data-testid": `gpu-holders-${g.index}` }), shown: "",
      };
      cards.push(c);
      const card = h("article", { class: "card gpu", "data-testid": `gpu-${g.index}`, "data-card": cards.length - 1 },
        h("header", {}, h("strong", {}, `GPU ${g.index}`), h("span", { class: "muted" }, g.name), c.extra),
        h("div", { class: "row" }, h("span", {}, "Utilization "), c.util),
        h("div", { class: "row" }, h("span", {}, "Memory "), c.mem),
        h("div", { class: "bar", title: "memory used" }, c.bar),
        chartEl,
        h("div", { class: "held-by" }, h("span", { class: "muted" }, "Held by"), c.holders));
      grid.append(card);
      observer?.observe(card);
      let chart: Chart | null = null;
      try { chart = lineChart(chartEl, 360, 140, ["utilization", "memory"], () => minutes * 60); } catch { /* no canvas (tests) */ }
      charts.push(chart);
    }
    if (!observer) cards.forEach((_, i) => draw(i));
    document.addEventListener("visibilitychange", onVisibility);
    if (!document.hidden) await start();
    const u = await backend.onJobChanged(() => { if (running) refreshHolders(); });
    if (disposed) u(); else unlisten = u;
  }
  load().catch((e) => grid.append(h("p", { class: "error" }, String(e))));
  return {
    el,
    dispose() {
      disposed = true;
      pause();
      document.removeEventListener("visibilitychange", onVisibility);
      observer?.disconnect();
      unlisten?.();
      charts.forEach((c) => c?.destroy());
    },
  };
}
