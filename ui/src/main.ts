// App shell: tabs, routing (#/gpus, #/queue, #/history, #/usage, #/submit, #/bookings, #/run/ID,
// #/compare/ids/1,2,3 and #/compare/name/NAME), drop handling, shortcuts.
import "./locale-fix";
import "./styles.css";
import { tauriBackend, type Backend } from "./backend";
import { h, type View } from "./dom";
import type { Status } from "./types";
import { gpusView } from "./views/gpus";
import { historyView } from "./views/history";
import { queueView } from "./views/queue";
import { runView } from "./views/run";
import { compareView } from "./views/compare";
import { submitView } from "./views/submit";
import { usageView } from "./views/usage";
import { bookingsView } from "./views/bookings";
import { connectionBanner, machineSwitcher } from "./machines";

export const TABS = [["gpus", "GPUs"], ["queue", "Queue"], ["history", "History"], ["usage", "Usage"], ["submit", "Submit"], ["bookings", "Bookings"]] as const;

export function route(hash: string): { tab: string; id?: number; arg?: string } {
  const m = hash.match(/^#\/run\/(\d+)/);
  if (m) return { tab: "run", id: Number(m[1]) };
  const c = hash.match(/^#\/compare\/((?:ids|name)\/.+)$/);
  if (c) return { tab: "compare", arg: c[1] };
  const t = hash.replace(/^#\//, "");
  return { tab: TABS.some(([k]) => k === t) ? t : "gpus" };
}

/** The banner over simulated GPUs: why (the engine's note, e.g. no driver), or that they were asked for. */
export function simBanner(status: Pick<Status, "gpu_backend" | "gpu_note">): string | null {
  if (status.gpu_backend !== "simulated") return null;
  const why = status.gpu_note ? `Simulated GPUs: ${status.gpu_note}.` : "Simulated GPUs (as configured).";
  return `${why} Jobs run in real Docker containers; GPU numbers are made up.`;
}

export async function mount(root: HTMLElement, backend: Backend) {
  const engine = await backend.engine();
  const which = h("span", { class: "muted", title: engine.socket ?? "", "data-testid": "engine" }, engine.label);
  const reload = () => location.reload();
  const machine = await machineSwitcher(backend, reload);
  if (engine.problem) {
    // Another user's engine holds this machine's GPUs: nothing to talk to, and no second engine.
    root.replaceChildren(h("header", { class: "top" }, h("h1", {}, "Gantry"), h("span", { class: "spacer" }), machine, which),
      h("div", { class: "banner warn", role: "alert", "data-testid": "engine-problem" }, engine.problem));
    return;
  }
  const [status, me, lost] = await Promise.all([backend.status(), backend.whoami(), connectionBanner(backend, reload)]);
  const go = (hash: string) => { location.hash = hash; };
  const nav = h("nav", { class: "tabs", role: "tablist" }, TABS.map(([k, label], i) =>
    h("a", { href: `#/${k}`, role: "tab", "data-tab": k, "data-testid": `tab-${k}`, title: `${label} (${i + 1})` }, label)));
  const sim = simBanner(status);
  const banner = sim ? h("div", { class: "banner sim", "data-testid": "sim-banner", role: "status" }, sim) : null;
  const outage = status.backend_problem ? h("div", { class: "banner warn", "data-testid": "backend-banner" }, status.backend_problem) : null;
  const store = status.store_problem ? h("div", { class: "banner warn", role: "alert" }, status.store_problem) : null;
  const disk = status.disk_problem ? h("div", { class: "banner warn", role: "alert", "data-testid": "disk-banner" }, status.disk_problem) : null;
  const main = h("main", {});
  const overlay = h("div", { class: "drop-overlay", hidden: true }, "Drop job specs to preview them");
  root.replaceChildren(
    h("header", { class: "top" }, h("h1", {}, "Gantry"), nav, h("span", { class: "spacer" }),
      machine, which, h("span", { class: "muted", "data-testid": "me" }, me.name)),
    lost, banner ?? "", store ?? "", outage ?? "", disk ?? "", main, overlay);

  const submit = submitView(backend, go);
  let current: View | null = null;
  function show() {
    const r = route(location.hash);
    nav.querySelectorAll("a").forEach((a) => a.setAttribute("aria-selected", String(a.dataset.tab === r.tab)));
    if (current && current !== submit) current.dispose();
    current = r.tab === "gpus" ? gpusView(backend, me.name)
      : r.tab === "queue" ? queueView(backend, me.uid, go)
      : r.tab === "history" ? historyView(backend, go)
      : r.tab === "usage" ? usageView(backend, me.name)
      : r.tab === "run" ? runView(backend, r.id!, go)
      : r.tab === "compare" ? compareView(backend, r.arg!, go)
      : r.tab === "bookings" ? bookingsView(backend)
      : submit;
    main.replaceChildren(current.el);
  }
  window.addEventListener("hashchange", show);
  show();

  const handleFiles = async (paths: string[]) => { go("#/submit"); await submit.handleFiles(paths); };
  // Same entry point as a real drop, for tests driving the app through WebDriver.
  (window as any).__gantryDrop = handleFiles;
  await backend.onFileDrop(handleFiles, (over) => { overlay.hidden = !over; });

  document.addEventListener("keydown", (e) => {
    const t = e.target as HTMLElement;
    if (t.tagName === "INPUT" || t.tagName === "SELECT" || t.tagName === "TEXTAREA" || e.ctrlKey || e.metaKey || e.altKey) return;
    const n = Number(e.key);
    if (n >= 1 && n <= TABS.length) go(`#/${TABS[n - 1][0]}`);
    else if (e.key === "/") { const s = document.querySelector<HTMLInputElement>("[data-testid=history-search]"); if (s) { e.preventDefault(); s.focus(); } }
  });
}

const root = document.getElementById("app");
if (root && (window as any).__TAURI_INTERNALS__) {
  mount(root, tauriBackend).catch((e) => { root.textContent = `Gantry could not start: ${e}`; });
}
