// Queue view: running and queued jobs, why each waits, cancel / priority for your own jobs.
import type { Backend } from "../backend";
import { h, clear, type View } from "../dom";
import { ask, duration, stateLabel } from "../format";
import { attachBox, openButtons, sessionLine, startSessionForm } from "../sessions";
import type { QueueEntry } from "../types";

export function sortQueue(q: QueueEntry[]): QueueEntry[] {
  const rank = (e: QueueEntry) => (e.job.state === "queued" ? 1 : 0);
  return [...q].sort((a, b) => rank(a) - rank(b) || (a.position ?? 0) - (b.position ?? 0) || a.job.id - b.job.id);
}

/** Where a started job runs: "GPU 0, 1", "CPU only" (it asked for no GPU), or that the backend has not said yet. */
export function runsOn(asked: number, held: number[]): string {
  if (asked === 0) return "CPU only";
  return held.length ? `GPU ${held.join(", ")}` : "GPU not reported yet";
}

export function queueView(backend: Backend, me: number | null, go: (hash: string) => void): View {
  const el = h("section", { class: "view", "data-testid": "view-queue" });
  const body = h("tbody");
  const empty = h("p", { class: "muted", hidden: true }, "No running or queued jobs. Drop a spec on this window to submit one.");
  const problem = h("p", { class: "error", hidden: true, role: "alert" });
  const fail = (msg: string) => { problem.textContent = msg; problem.hidden = false; };
  // The workstation in use, for the attach command (`gantry --host H attach N`).
  // Rows wait for it (drawn once, not again when it arrives).
  let host: string | null = null;
  const sessions = h("div", {});
  const ready = backend.machines().then((m) => { host = m.current; }, () => {}).then(() => {
    sessions.replaceChildren(startSessionForm(backend, host, () => { refresh().catch(() => {}); }));
  });
  el.append(
    h("div", { class: "toolbar" }, h("h2", {}, "Queue")),
    sessions,
    problem,
    h("table", { class: "grid" },
      h("thead", {}, h("tr", {}, ["#", "State", "Owner", "Name", "Image", "Asks", "Waiting", "Why / where", ""].map((t) => h("th", {}, t)))),
      body),
    empty);

  let unsub: (() => void) | null = null;
  let stopGpus: (() => void) | null = null;

  async function refresh() {
    await ready;
    const q = sortQueue(await backend.queue());
    clear(body);
    empty.hidden = q.length > 0;
    for (const e of q) {
      const j = e.job;
      const mine = me === 0 || j.owner_uid === me;
      const eta = e.estimated_start ? ` · starts ~${e.estimated_start <= Date.now() ? "now" : "in " + duration(e.estimated_start - Date.now())}` : "";
      const where = j.state === "queued" ? `#${e.position ?? "?"} · ${e.reason ?? ""}${eta}` : runsOn(j.gpus, e.gpus_assigned);
      const session = j.session ?? null;
      // Only a session's owner may attach or open its ports (root too is refused by the engine).
      const live = session !== null && j.state === "running" && j.owner_uid === me;
      const waited = j.state === "queued" ? duration(Date.now() - j.submitted_at) : duration(Date.now() - (j.started_at ?? j.submitted_at));
      body.append(h("tr", { "data-testid": `queue-row-${j.id}`, "data-state": j.state },
        h("td", {}, h("a", { href: `#/run/${j.id}` }, String(j.id))),
        h("td", {}, h("span", { class: `state ${j.state}` }, stateLabel(j.state))),
        h("td", {}, j.owner),
        h("td", {}, j.name, session && h("div", { class: "session-line muted", "data-testid": `session-${j.id}` }, sessionLine(session))),
        h("td", { class: "mono" }, j.image),
        h("td", {}, ask(j.gpus, j.gpu_memory)),
        h("td", {}, waited),
        h("td", { class: "reason" }, where),
        h("td", { class: "actions" },
          h("button", { onclick: () => go(`#/run/${j.id}`), title: "Open the run page and its log" }, "Logs"),
          live && openButtons(backend, j.id, session!.ports, fail),
          live && attachBox(backend, j.id, host),
          mine && j.state === "queued" && h("button", { title: "Raise priority", "aria-label": `raise priority of job ${j.id}`, onclick: async () => { await backend.setPriority(j.id, j.priority + 1); refresh(); } }, "▲"),
          mine && j.state === "queued" && h("button", { title: "Lower priority", "aria-label": `lower priority of job ${j.id}`, onclick: async () => { await backend.setPriority(j.id, j.priority - 1); refresh(); } }, "▼"),
          mine && h("button", { class: "danger", "data-testid": `cancel-${j.id}`, onclick: async () => { await backend.cancel(j.id); refresh(); } }, "Cancel"))));
    }
  }
  refresh().catch((e) => el.append(h("p", { class: "error" }, String(e))));
  backend.onJobChanged(() => { refresh(); }).then((u) => (unsub = u));
  // Reasons change as GPUs free up: refresh on the engine's 1 Hz push, at most every 2 s.
  let last = 0;
  stopGpus = backend.watchGpus((at) => { if (at - last > 2000) { last = at; refresh(); } });
  return { el, dispose() { unsub?.(); stopGpus?.(); } };
}
