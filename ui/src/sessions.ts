// Interactive sessions in the app: "ends in", the attach command (the app has no terminal of its
// own: it shows the `gantry attach ID` command with a copy button), "Open" per port, and the
// "Start a session" form (the same spec as `gantry shell` / `gantry notebook`).
import type { Backend } from "./backend";
import { h } from "./dom";
import type { QueueSession, SessionAsk } from "./types";

/** How long something lasts, for a sentence: "45 s", "12 min", "2 h 10 min", "1 d 3 h" (as the CLI). */
export function words(ms: number): string {
  const s = Math.max(0, Math.floor(ms / 1000));
  const d = Math.floor(s / 86400), hr = Math.floor(s / 3600) % 24, m = Math.floor(s / 60) % 60;
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${m} min`;
  if (s < 86400) return m ? `${hr} h ${m} min` : `${hr} h`;
  return hr ? `${d} d ${hr} h` : `${d} d`;
}

/** "ends in 1 h 20 min", "ends now" once past, null without an end (queued, or no length). */
export function endsIn(endsAt: number | null | undefined, now = Date.now()): string | null {
  if (endsAt === null || endsAt === undefined) return null;
  return endsAt <= now ? "ends now" : `ends in ${words(endsAt - now)}`;
}

/** "idle for 2 h 10 min" for a process outside Gantry on a GPU at 0 % (the engine says since when). */
export function idleFor(idleSince: number | null | undefined, now = Date.now()): string | null {
  return idleSince === null || idleSince === undefined ? null : `idle for ${words(now - idleSince)}`;
}

/** The command that attaches a terminal to session `id`, on the workstation in use (`host`). */
export function attachCommand(id: number, host: string | null): string {
  return host ? `gantry --host ${host} attach ${id}` : `gantry attach ${id}`;
}

/** The session's facts for a row: "session · ends in 1 h 20 min · ports 8888". */
export function sessionLine(s: QueueSession, now = Date.now()): string {
  const parts = ["session"];
  const end = endsIn(s.ends_at, now);
  if (end) parts.push(end);
  if (s.ports.length) parts.push(`port${s.ports.length === 1 ? "" : "s"} ${s.ports.join(", ")}`);
  return parts.join(" · ");
}

/** The command to attach, with a copy button. */
export function attachBox(backend: Backend, id: number, host: string | null): HTMLElement {
  const cmd = attachCommand(id, host);
  const said = h("span", { class: "muted", "aria-live": "polite" });
  return h("span", { class: "attach", "data-testid": `attach-${id}` },
    h("code", { class: "mono" }, cmd),
    h("button", { title: "Copy the command: run it in a terminal to attach", "data-testid": `copy-attach-${id}`, onclick: async () => {
      try { await backend.copyText(cmd); said.textContent = "copied"; } catch (e) { said.textContent = `could not copy: ${e}`; }
    } }, "Copy"), said);
}

/** One "Open PORT" button per port: the URL (a notebook's with its token) in the browser. */
export function openButtons(backend: Backend, id: number, ports: number[], onError: (msg: string) => void): HTMLElement[] {
  return ports.map((p) => h("button", { "data-testid": `open-${id}-${p}`, title: `Open port ${p} of job ${id} in the browser (for you only, while it runs)`, onclick: async () => {
    try { await backend.openPort(id, p); } catch (e) { onError(String(e)); }
  } }, `Open ${p}`));
}

/** The form's fields → what to ask the engine for; a message when a field is wrong. */
export function sessionAsk(f: { kind: string; gpus: string; length: string; image: string; port: string; name?: string }): SessionAsk | string {
  const gpus = Number(f.gpus);
  if (!Number.isInteger(gpus) || gpus < 0) return `GPUs must be a whole number (0 for none), not "${f.gpus}"`;
  const port = f.kind === "notebook" ? Number(f.port || "8888") : null;
  if (port !== null && (!Number.isInteger(port) || port < 1 || port > 65535)) return `the port must be 1 to 65535, not "${f.port}"`;
  const opt = (v: string | undefined) => (v && v.trim() ? v.trim() : null);
  return { notebook_port: port, gpus, gpu_memory: null, gpu_type: null, image: opt(f.image), length: opt(f.length), cpus: null, memory: null, name: opt(f.name) };
}

/** "Start a session": a shell or a notebook; once queued, says how to attach (and the queue shows it). */
export function startSessionForm(backend: Backend, host: string | null, onStarted: (id: number) => void): HTMLElement {
  const kind = h("select", { "data-testid": "session-kind", "aria-label": "kind of session" },
    h("option", { value: "shell" }, "Shell"), h("option", { value: "notebook" }, "Notebook (Jupyter)"));
  const gpus = h("input", { type: "number", min: 0, value: "1", size: 3, "data-testid": "session-gpus", "aria-label": "GPUs" });
  const length = h("input", { placeholder: "lab default", size: 8, "data-testid": "session-length", "aria-label": "length, e.g. 2h" });
  const image = h("input", { placeholder: "this machine's folders", size: 22, "data-testid": "session-image", "aria-label": "image" });
  const port = h("input", { type: "number", min: 1, max: 65535, value: "8888", size: 5, "data-testid": "session-port", "aria-label": "notebook port", hidden: true });
  const out = h("div", { class: "session-out", "data-testid": "session-out", "aria-live": "polite" });
  kind.addEventListener("change", () => {
    port.hidden = kind.value !== "notebook";
    image.placeholder = kind.value === "notebook" ? "the lab's notebook image" : "this machine's folders";
  });
  const form = h("form", { class: "session-form", "data-testid": "session-form", onsubmit: async (ev: Event) => {
    ev.preventDefault();
    const ask = sessionAsk({ kind: kind.value, gpus: gpus.value, length: length.value, image: image.value, port: port.value });
    if (typeof ask === "string") { out.replaceChildren(h("span", { class: "error" }, ask)); return; }
    try {
      const id = await backend.startSession(ask);
      out.replaceChildren(h("span", {}, `Session ${id} queued. `),
        ask.notebook_port !== null ? h("span", { class: "muted" }, `"Open ${ask.notebook_port}" on its row once it runs; or attach: `) : h("span", { class: "muted" }, "Attach a terminal: "),
        attachBox(backend, id, host));
      onStarted(id);
    } catch (e) {
      out.replaceChildren(h("span", { class: "error" }, String(e)));
    }
  } },
    h("strong", {}, "Start a session"), kind, h("label", {}, "GPUs ", gpus), h("label", {}, "for ", length), h("label", {}, "image ", image), port,
    h("button", { type: "submit", class: "primary", "data-testid": "session-start" }, "Start"));
  return h("div", { class: "sessions" }, form, out);
}
