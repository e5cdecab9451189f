// Bookings view: a GPUs × hours timeline of the bookings (`gantry bookings`), mine highlighted; drag
// across a GPU row to pick a slot, then a small form books it (`gantry book`); cancel my own.
import type { Backend } from "../backend";
import { h, clear, type View } from "../dom";
import type { BookingView, Bookings, GpuSample } from "../types";

export const HOUR_MS = 3_600_000;
/** The timeline shows this much from its start; ‹ and › move it by a day. */
export const SPAN_MS = 48 * HOUR_MS;

/** Start of the slot `ms` is in. Slots count from midnight UTC, so from the epoch. */
export function slotFloor(ms: number, slotMs: number): number {
  return ms - (((ms % slotMs) + slotMs) % slotMs);
}

/** Pixels per slot: an hour is 28 px wide whatever the slot, but a slot is at least 10 px. */
export function slotPx(slotMs: number): number {
  return Math.max(10, Math.round((28 * slotMs) / HOUR_MS));
}

/** A drag from x0 to x1 (px from the timeline's left edge, either way) → the slots it covers, whole. */
export function slotFromDrag(x0: number, x1: number, originMs: number, slotMs: number, px: number, slots: number): { start_ms: number; end_ms: number } {
  const clamp = (s: number) => Math.min(slots, Math.max(0, s));
  const a = clamp(Math.floor(Math.min(x0, x1) / px));
  const b = clamp(Math.floor(Math.max(x0, x1) / px) + 1);
  return { start_ms: originMs + a * slotMs, end_ms: originMs + Math.max(b, a + 1) * slotMs };
}

export interface Placed { booking: BookingView; rows: number[]; /** Not enough GPUs of its kind were free in the picture: drawn over others. */ crowded: boolean }

/** Which GPU rows each open booking is drawn on. A booking is for a number of GPUs (of a type), not
 * for given ones until it is active (then `gpu_indices`): the others go on the first rows of their
 * type free for their whole time, in order of start. */
export function layoutBookings(bookings: BookingView[], gpus: Pick<GpuSample, "index" | "name">[]): Placed[] {
  const open = bookings.filter((b) => b.state === "booked" || b.state === "active")
    .sort((a, b) => Number(b.gpu_indices.length > 0) - Number(a.gpu_indices.length > 0) || a.start_ms - b.start_ms || a.id - b.id);
  const taken = new Map<number, [number, number][]>();
  const free = (row: number, b: BookingView) => (taken.get(row) ?? []).every(([s, e]) => e <= b.start_ms || s >= b.end_ms);
  const out: Placed[] = [];
  for (const b of open) {
    const kind = b.gpu_type ? gpus.filter((g) => g.name.toLowerCase().includes(b.gpu_type!.toLowerCase())) : gpus;
    let rows = b.gpu_indices.length ? [...b.gpu_indices] : kind.filter((g) => free(g.index, b)).map((g) => g.index).slice(0, b.gpus);
    const crowded = rows.length < b.gpus;
    if (crowded) rows = [...rows, ...kind.map((g) => g.index).filter((i) => !rows.includes(i))].slice(0, b.gpus);
    for (const r of rows) (taken.get(r) ?? taken.set(r, []).get(r)!).push([b.start_ms, b.end_ms]);
    out.push({ booking: b, rows, crowded });
  }
  return out.sort((a, b) => a.booking.start_ms - b.booking.start_ms || a.booking.id - b.booking.id);
}

const pad = (n: number) => String(n).padStart(2, "0");
/** "14:00", and "Tue 3" at local midnight: the labels over the hours. */
export function hourLabels(originMs: number, spanMs: number): { at: number; text: string; day: boolean }[] {
  const out = [];
  const first = Math.ceil(originMs / HOUR_MS) * HOUR_MS;
  for (let t = first; t < originMs + spanMs; t += HOUR_MS) {
    const d = new Date(t);
    const day = d.getHours() === 0;
    out.push({ at: t, text: day ? `${d.toLocaleDateString(undefined, { weekday: "short" })} ${d.getDate()}` : `${pad(d.getHours())}:00`, day });
  }
  return out;
}

/** "Tue 3 14:00–18:00" (local). */
export function span(startMs: number, endMs: number): string {
  const s = new Date(startMs), e = new Date(endMs);
  const day = (d: Date) => `${d.toLocaleDateString(undefined, { weekday: "short" })} ${d.getDate()}`;
  const hm = (d: Date) => `${pad(d.getHours())}:${pad(d.getMinutes())}`;
  return s.toDateString() === e.toDateString() || (e.getHours() === 0 && e.getMinutes() === 0 && endMs - startMs <= 86_400_000)
    ? `${day(s)} ${hm(s)}–${hm(e)}` : `${day(s)} ${hm(s)} – ${day(e)} ${hm(e)}`;
}

export function bookingsView(backend: Backend): View {
  const el = h("section", { class: "view bookings", "data-testid": "view-bookings" });
  const problem = h("p", { class: "error", hidden: true, role: "alert", "data-testid": "bookings-error" });
  const rulesLine = h("p", { class: "muted", "data-testid": "bookings-rules" });
  const board = h("div", { class: "timeline", "data-testid": "timeline" });
  const form = h("div", { class: "book-form", "data-testid": "book-form", hidden: true });
  const list = h("tbody");
  let data: Bookings | null = null;
  let gpus: GpuSample[] = [];
  let shift = 0;
  let disposed = false;
  const fail = (e: unknown) => { problem.textContent = String(e); problem.hidden = false; };

  el.append(
    h("div", { class: "toolbar" }, h("h2", {}, "Bookings"),
      h("button", { "aria-label": "a day earlier", "data-testid": "earlier", onclick: () => { shift = Math.max(0, shift - 1); draw(); } }, "‹"),
      h("button", { "aria-label": "a day later", "data-testid": "later", onclick: () => { shift++; draw(); } }, "›"),
      h("span", { class: "muted" }, "Drag across a GPU's row to book it.")),
    rulesLine, problem, board, form,
    h("h3", {}, "Open bookings"),
    h("table", { class: "grid" }, h("thead", {}, h("tr", {}, ["#", "Owner", "GPUs", "When", "State", "Note", ""].map((t) => h("th", {}, t)))), list));

  function showForm(slot: { start_ms: number; end_ms: number }, gpu: GpuSample) {
    const count = h("input", { type: "number", min: 1, max: data?.rules.max_gpus ?? 1, value: "1", size: 3, "data-testid": "book-gpus", "aria-label": "GPUs" });
    const type = h("input", { size: 14, value: "", placeholder: "any GPU", "data-testid": "book-type", "aria-label": "GPU type" });
    const note = h("input", { size: 24, placeholder: "note (only you see it)", "data-testid": "book-note", "aria-label": "note" });
    const said = h("span", { "aria-live": "polite" });
    form.hidden = false;
    form.replaceChildren(h("form", { onsubmit: async (ev: Event) => {
      ev.preventDefault();
      const n = Number(count.value);
      if (!Number.isInteger(n) || n < 1) { said.replaceChildren(h("span", { class: "error" }, `GPUs must be a whole number from 1, not "${count.value}"`)); return; }
      try {
        const b = await backend.book({ gpus: n, gpu_type: type.value.trim() || null, start_ms: slot.start_ms, end_ms: slot.end_ms, note: note.value.trim() || null });
        form.hidden = true;
        clear(form);
        await load();
        said.textContent = `booking ${b.id}`;
      } catch (e) { said.replaceChildren(h("span", { class: "error" }, String(e))); }
    } },
      h("strong", { "data-testid": "book-when" }, `Book ${span(slot.start_ms, slot.end_ms)}`), " (from GPU ", String(gpu.index), ") ",
      h("label", {}, "GPUs ", count), h("label", {}, "type ", type), note,
      h("button", { type: "submit", class: "primary", "data-testid": "book-submit" }, "Book"),
      h("button", { type: "button", onclick: () => { form.hidden = true; clear(form); draw(); } }, "Cancel"), said));
    count.focus();
  }

  function draw() {
    if (!data) return;
    const slot = data.rules.slot_ms > 0 ? data.rules.slot_ms : HOUR_MS;
    const px = slotPx(slot);
    const origin = slotFloor(data.now_ms, slot) + shift * 24 * HOUR_MS;
    const slots = Math.ceil(SPAN_MS / slot);
    const width = slots * px;
    const x = (ms: number) => ((ms - origin) / slot) * px;
    const placed = layoutBookings(data.bookings, gpus);
    clear(board);
    const head = h("div", { class: "tl-head", style: `width:${width}px` },
      // Every other hour (28 px an hour is narrower than "14:00"), and each day's start.
      hourLabels(origin, SPAN_MS).filter((l) => l.day || new Date(l.at).getHours() % 2 === 0).map((l) => h("span", { class: `tl-hour${l.day ? " day" : ""}`, style: `left:${x(l.at)}px` }, l.text)));
    const rows = gpus.map((g) => {
      const row = h("div", { class: "tl-row", style: `width:${width}px`, "data-testid": `tl-row-${g.index}`, "data-gpu": g.index });
      for (const p of placed.filter((p) => p.rows.includes(g.index))) {
        const b = p.booking;
        const left = Math.max(0, x(b.start_ms)), right = Math.min(width, x(b.end_ms));
        if (right <= 0 || left >= width) continue;
        row.append(h("div", {
          class: `tl-booking ${b.state}${b.mine ? " mine" : ""}${p.crowded ? " crowded" : ""}`, "data-testid": `tl-booking-${b.id}-${g.index}`,
          style: `left:${left}px;width:${Math.max(2, right - left)}px`,
          title: `booking ${b.id}: ${b.owner}, ${b.gpus} GPU${b.gpus === 1 ? "" : "s"}${b.gpu_type ? ` ${b.gpu_type}` : ""}, ${span(b.start_ms, b.end_ms)}${b.note ? ` — ${b.note}` : ""}`,
        }, b.mine ? `mine${b.note ? `: ${b.note}` : ""}` : b.owner));
      }
      const now = x(data!.now_ms);
      if (now >= 0 && now <= width) row.append(h("div", { class: "tl-now", style: `left:${now}px` }));
      // Drag to pick a slot: the selection follows the pointer; releasing opens the form.
      const sel = h("div", { class: "tl-select", hidden: true });
      row.append(sel);
      let from: number | null = null;
      const at = (ev: MouseEvent) => ev.clientX - row.getBoundingClientRect().left;
      const pick = (x1: number) => slotFromDrag(from!, x1, origin, slot, px, slots);
      row.addEventListener("mousedown", (ev: MouseEvent) => {
        if ((ev.target as HTMLElement).classList.contains("tl-booking") || ev.button !== 0) return;
        from = at(ev);
        const s = pick(from);
        sel.hidden = false; sel.style.left = `${x(s.start_ms)}px`; sel.style.width = `${x(s.end_ms) - x(s.start_ms)}px`;
        ev.preventDefault();
      });
      row.addEventListener("mousemove", (ev: MouseEvent) => {
        if (from === null) return;
        const s = pick(at(ev));
        sel.style.left = `${x(s.start_ms)}px`; sel.style.width = `${x(s.end_ms) - x(s.start_ms)}px`;
      });
      const done = (ev: MouseEvent) => {
        if (from === null) return;
        const s = pick(at(ev));
        from = null;
        showForm(s, g);
      };
      row.addEventListener("mouseup", done);
      row.addEventListener("mouseleave", (ev: MouseEvent) => { if (from !== null) done(ev); });
      return h("div", { class: "tl-line" }, h("span", { class: "tl-gpu", title: g.name }, `GPU ${g.index}`), row);
    });
    board.append(h("div", { class: "tl-scroll" }, h("div", { class: "tl-line" }, h("span", { class: "tl-gpu" }), head), rows));

    clear(list);
    const open = data.bookings.filter((b) => b.state === "booked" || b.state === "active");
    if (!open.length) list.append(h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No bookings. Drag across a GPU's row above to book one.")));
    for (const b of open) {
      list.append(h("tr", { class: b.mine ? "mine" : "", "data-testid": `booking-${b.id}` },
        h("td", {}, String(b.id)), h("td", {}, b.owner),
        h("td", {}, `${b.gpus}${b.gpu_type ? ` × ${b.gpu_type}` : ""}${b.gpu_indices.length ? ` (GPU ${b.gpu_indices.join(", ")})` : ""}`),
        h("td", {}, span(b.start_ms, b.end_ms)),
        h("td", {}, b.state + (b.waiting_for.length ? ` · waiting for job ${b.waiting_for.join(", ")}` : "")),
        h("td", {}, b.note ?? ""),
        h("td", {}, b.mine && h("button", { class: "danger", "data-testid": `cancel-booking-${b.id}`, onclick: async () => {
          try { await backend.cancelBooking(b.id); await load(); } catch (e) { fail(e); }
        } }, "Cancel"))));
    }
  }

  async function load() {
    const [bk, g] = await Promise.all([backend.bookings(false), backend.gpus()]);
    if (disposed) return;
    data = bk;
    gpus = g.gpus;
    const r = bk.rules;
    rulesLine.textContent = !r.enabled ? "This lab's engine takes no bookings ([bookings] in the lab config)." : [
      `Slots of ${r.slot_ms / 60_000} min`, `up to ${Math.round(r.max_ahead_ms / 86_400_000)} days ahead`,
      r.max_length_ms > 0 ? `at most ${Math.round(r.max_length_ms / 3_600_000)} h long` : null, `at most ${r.max_gpus} GPU${r.max_gpus === 1 ? "" : "s"} a booking`,
      r.max_gpu_hours_week != null ? `${r.max_gpu_hours_week} GPU-hours a week each` : null,
      `released when unused ${Math.round(r.release_after_ms / 60_000)} min after its start`,
    ].filter(Boolean).join(" · ");
    draw();
  }
  load().catch(fail);
  const timer = setInterval(() => { if (form.hidden) load().catch(() => {}); }, 30_000);
  return { el, dispose() { disposed = true; clearInterval(timer); } };
}
