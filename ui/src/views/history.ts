// History view: completed runs, virtualized and paged from SQLite, with filters, sort and a GPU timeline.
import type { Backend } from "../backend";
import { h, clear, type View } from "../dom";
import { duration, gpuHours, stateLabel, time } from "../format";
import type { HistoryQuery, HistoryRow, JobState, TimelineRun } from "../types";
import { laneBox, pagesFor, visibleSlice } from "../virtual";

export const ROW_H = 30;
export const PAGE = 200;

/** Page cache: fetches each page of the current query once. */
export class Pager {
  private pages = new Map<number, HistoryRow[] | Promise<void>>();
  constructor(private fetch: (offset: number, limit: number) => Promise<HistoryRow[]>) {}
  row(i: number): HistoryRow | undefined {
    const p = this.pages.get(Math.floor(i / PAGE));
    return Array.isArray(p) ? p[i % PAGE] : undefined;
  }
  /** Is row i's page in, or on its way? */
  requested(i: number): boolean {
    return this.pages.has(Math.floor(i / PAGE));
  }
  /** Load missing pages for rows first..last; resolves when they are in. */
  async ensure(first: number, last: number): Promise<boolean> {
    const wait: Promise<void>[] = [];
    let fetched = false;
    for (const p of pagesFor(first, last, PAGE)) {
      const have = this.pages.get(p);
      if (Array.isArray(have)) continue;
      if (have) { wait.push(have); continue; }
      fetched = true;
      const pr = this.fetch(p * PAGE, PAGE).then((rows) => { this.pages.set(p, rows); });
      this.pages.set(p, pr);
      wait.push(pr);
    }
    await Promise.all(wait);
    return fetched;
  }
}

const COLS: [string, string | null][] = [
  ["#", "id"], ["Name", "name"], ["Owner", "owner"], ["Status", null], ["Exit", "exit_code"], ["GPUs", null],
  ["Finished", "finished"], ["Duration", "duration"], ["GPU-h", "gpu_hours"],
];

/** The GPUs column: "GPU 0", "GPU 0,1", or "—" for a run without a GPU (a bare "0" read as "none"). */
export function gpuList(gpus: number[]): string {
  return gpus.length ? `GPU ${gpus.join(",")}` : "—";
}

/** A sweep's name from one of its runs' (`sweep[lr=0.1]` -> `sweep`); null for a run of no sweep. */
export function sweepOf(name: string): string | null {
  const m = name.match(/^(.+)\[[^\]]*\]$/);
  return m ? m[1] : null;
}

export function historyView(backend: Backend, go: (hash: string) => void): View {
  const el = h("section", { class: "view history", "data-testid": "view-history" });
  const q: HistoryQuery = { sort: "finished", asc: false };
  const text = h("input", { type: "search", placeholder: "Search name or image  ( / )", "data-testid": "history-search", "aria-label": "Search" });
  const user = h("input", { placeholder: "user", "aria-label": "User", size: 10 });
  const image = h("input", { placeholder: "image", "aria-label": "Image", size: 16 });
  const status = h("select", { "aria-label": "Status" }, ["", "succeeded", "failed", "cancelled", "timed_out"].map((s) => h("option", { value: s }, s ? stateLabel(s) : "any status")));
  const since = h("input", { type: "date", "aria-label": "Finished from" });
  const until = h("input", { type: "date", "aria-label": "Finished until" });
  const count = h("span", { class: "muted", "data-testid": "history-count" });
  // Ticked runs, for Compare (issue 30 item 2).
  const ticked = new Set<number>();
  const compareBtn = h("button", { "data-testid": "history-compare", disabled: true, onclick: () => go(`#/compare/ids/${[...ticked].sort((a, b) => a - b).join(",")}`) }, "Compare");
  const syncCompare = () => { compareBtn.disabled = ticked.size < 2; compareBtn.textContent = ticked.size ? `Compare ${ticked.size}` : "Compare"; };
  const head = h("div", { class: "vt-head" });
  const scroller = h("div", { class: "vt-scroll", tabindex: 0, "data-testid": "history-scroll" });
  const inner = h("div", { class: "vt-inner" });
  scroller.append(inner);
  const period = h("select", { "aria-label": "Timeline period" }, [["1", "1 hour"], ["6", "6 hours"], ["24", "24 hours"], ["168", "7 days"]].map(([v, l]) => h("option", { value: v, selected: v === "24" }, l)));
  const lanes = h("div", { class: "timeline", "data-testid": "timeline" });

  el.append(
    h("div", { class: "toolbar" }, h("h2", {}, "History"), count, h("span", { class: "spacer" }), compareBtn),
    h("div", { class: "filters" }, text, user, image, status, h("label", {}, "from ", since), h("label", {}, "to ", until)),
    h("div", { class: "vt" }, head, scroller),
    h("div", { class: "toolbar" }, h("h3", {}, "GPU timeline"), period),
    lanes);

  let total = 0;
  let pager = new Pager((offset, limit) => backend.history({ ...q, offset, limit }));
  let gen = 0;

  function renderHead() {
    clear(head);
    for (const [label, key] of COLS) {
      const arrow = key && q.sort === key ? (q.asc ? " ▲" : " ▼") : "";
      head.append(h("div", { class: key ? "sortable" : "", role: "columnheader", onclick: () => {
        if (!key) return;
        q.asc = q.sort === key ? !q.asc : false;
        q.sort = key;
        reload();
      } }, label + arrow));
    }
  }

  function rowEl(i: number): HTMLElement {
    const r = pager.row(i);
    if (!r) return h("div", { class: "vt-row loading" }, "…");
    const gh = gpuHours(r.gpus.length, r.started_at, r.finished_at);
    const tick = h("input", { type: "checkbox", "aria-label": `Compare #${r.id}`, "data-testid": `history-tick-${r.id}`, checked: ticked.has(r.id),
      onclick: (e: Event) => { e.stopPropagation(); if ((e.target as HTMLInputElement).checked) ticked.add(r.id); else ticked.delete(r.id); syncCompare(); } });
    const sweep = sweepOf(r.name);
    return h("div", { class: "vt-row", "data-testid": `history-row-${r.id}`, tabindex: -1, onclick: () => go(`#/run/${r.id}`) },
      h("div", {}, tick, ` ${r.id}`),
      h("div", { title: r.image }, r.name, sweep ? h("a", { class: "sweep-link", href: `#/compare/name/${encodeURIComponent(sweep)}`, "data-testid": `history-sweep-${r.id}`, onclick: (e: Event) => e.stopPropagation() }, " sweep") : ""),
      h("div", {}, r.owner),
      h("div", {}, h("span", { class: `state ${r.status}` }, stateLabel(r.status))), h("div", {}, r.exit_code ?? "-"),
      h("div", {}, gpuList(r.gpus)), h("div", {}, time(r.finished_at)),
      h("div", {}, duration(r.started_at && r.finished_at ? r.finished_at - r.started_at : null)), h("div", {}, gh ? gh.toFixed(2) : "0"));
  }

  /** Rows on screen by index, in DOM order: a scroll removes the rows that left and adds the ones that
   * came into view, and leaves the others alone (no rebuild, no re-insertion: less layout per frame). */
  let onScreen = new Map<number, HTMLElement>();
  function paint() {
    const s = visibleSlice(scroller.scrollTop, scroller.clientHeight || 480, ROW_H, total);
    for (const [i, el] of onScreen) {
      if (i < s.first || i > s.last || (el.classList.contains("loading") && pager.row(i))) { el.remove(); onScreen.delete(i); }
    }
    let after: HTMLElement | null = null;
    for (let i = s.last; i >= s.first; i--) {
      let el = onScreen.get(i);
      if (!el) { el = rowEl(i); el.style.top = `${i * ROW_H}px`; inner.insertBefore(el, after); onScreen.set(i, el); }
      after = el;
    }
    const height = `${total * ROW_H}px`;
    if (inner.style.height !== height) inner.style.height = height;
    return s;
  }

  /** Rows around the view are fetched too, so a wheel scroll rarely shows "…". */
  const AHEAD = 50;
  let marked = false;
  async function fetchRows(g: number) {
    const s = visibleSlice(scroller.scrollTop, scroller.clientHeight || 480, ROW_H, total);
    if (await pager.ensure(Math.max(0, s.first - AHEAD), Math.min(total - 1, s.last + AHEAD)) && g === gen) paint();
    // For the app benchmark (scripts/bench-app.sh): when the first rows are on screen.
    if (!marked && g === gen && s.last >= s.first) { marked = true; performance.mark("gantry:history-rows"); }
  }

  /** A jump (scrollbar drag, End) to rows not yet asked for fetches once the view rests for JUMP_MS, so a
   * drag across 100k rows does not queue a page for every place it passed. */
  const JUMP_MS = 60;
  let jumpTimer: ReturnType<typeof setTimeout> | undefined;
  function onScroll() {
    const g = gen;
    const s = paint();
    clearTimeout(jumpTimer);
    if (s.last >= s.first && !pager.requested(s.first) && !pager.requested(s.last)) jumpTimer = setTimeout(() => fetchRows(g), JUMP_MS);
    else fetchRows(g);
  }

  async function reload() {
    const g = ++gen;
    q.text = text.value || undefined;
    q.user = user.value || undefined;
    q.image = image.value || undefined;
    q.status = (status.value || undefined) as JobState | undefined; // the select offers final states only
    q.since = since.value ? new Date(since.value + "T00:00:00").getTime() : undefined;
    q.until = until.value ? new Date(until.value + "T00:00:00").getTime() + 86_400_000 : undefined;
    renderHead();
    pager = new Pager((offset, limit) => backend.history({ ...q, offset, limit }));
    onScreen = new Map();
    clear(inner);
    total = await backend.historyCount(q);
    if (g !== gen) return;
    count.textContent = `${total.toLocaleString()} run${total === 1 ? "" : "s"}`;
    scroller.scrollTop = 0;
    paint();
    await fetchRows(g);
  }

  async function drawTimeline() {
    const to = Date.now();
    const from = to - Number(period.value) * 3_600_000;
    const [runs, gpus] = await Promise.all([backend.timeline(from, to), backend.gpus()]);
    renderTimeline(lanes, runs, gpus.gpus.length, from, to, go);
  }

  let timer: ReturnType<typeof setTimeout> | undefined;
  const debounced = () => { clearTimeout(timer); timer = setTimeout(reload, 200); };
  [text, user, image].forEach((i) => i.addEventListener("input", debounced));
  [status, since, until].forEach((i) => i.addEventListener("change", reload));
  scroller.addEventListener("scroll", () => { onScroll(); });
  period.addEventListener("change", drawTimeline);
  let unsub: (() => void) | null = null;
  backend.onJobChanged((ev) => { if (["succeeded", "failed", "cancelled", "timed_out"].includes(ev.state)) { reload(); drawTimeline(); } }).then((u) => (unsub = u));
  reload().catch((e) => el.append(h("p", { class: "error" }, String(e))));
  drawTimeline().catch(() => {});
  return { el, dispose() { unsub?.(); clearTimeout(timer); clearTimeout(jumpTimer); } };
}

export function renderTimeline(el: HTMLElement, runs: TimelineRun[], gpuCount: number, from: number, to: number, go: (h: string) => void) {
  clear(el);
  const width = Math.max(300, (el.clientWidth || 900) - 70);
  const now = Date.now();
  for (let g = 0; g < gpuCount; g++) {
    const lane = h("div", { class: "lane-track", style: `width:${width}px` });
    for (const r of runs.filter((r) => r.gpus.includes(g))) {
      const b = laneBox(r.start, r.end, from, to, width, now);
      if (!b) continue;
      lane.append(h("div", {
        class: `run ${r.end === null ? "live" : r.reason ?? ""}`, style: `left:${b.x}px;width:${b.w}px`,
        title: `#${r.job_id} ${r.name} (${r.owner}) ${time(r.start)} → ${r.end ? time(r.end) : "running"}`,
        onclick: () => go(`#/run/${r.job_id}`),
      }));
    }
    el.append(h("div", { class: "lane" }, h("span", { class: "lane-label" }, `GPU ${g}`), lane));
  }
  el.append(h("div", { class: "lane-axis muted" }, h("span", {}, time(from)), h("span", {}, time(to))));
}
