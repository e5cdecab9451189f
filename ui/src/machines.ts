// The header's machine switcher ("This computer" and remote workstations reached with ssh) and the
// banner shown while a workstation's connection is lost (the app retries by itself).
import type { Backend } from "./backend";
import { h } from "./dom";
import type { ConnectionEvent } from "./types";

const LOCAL = "";
const OTHER = "\u0000other";

/** A select that switches machines; `reload` restarts the UI on the new engine. */
export async function machineSwitcher(backend: Backend, reload: () => void): Promise<HTMLElement> {
  const m = await backend.machines();
  const error = h("span", { class: "switch-error", role: "alert", "data-testid": "machine-error", hidden: true });
  const opt = (value: string, label: string) => h("option", { value, selected: (m.current ?? LOCAL) === value }, label);
  const hosts = [...m.saved, ...m.ssh_config];
  if (m.current && !hosts.includes(m.current)) hosts.unshift(m.current);
  const select = h("select", { "data-testid": "machine", "aria-label": "Machine", title: "Which machine's queue this window shows" },
    opt(LOCAL, "This computer"),
    hosts.length ? h("optgroup", { label: "Workstations (ssh)" }, hosts.map((x) => opt(x, x))) : null,
    opt(OTHER, "Add a workstation…"));
  const connect = async (host: string | null) => {
    select.disabled = true;
    error.hidden = true;
    try {
      await backend.connectMachine(host);
      reload();
    } catch (e) {
      error.textContent = `Cannot connect to ${host}: ${e}`;
      error.hidden = false;
      select.value = m.current ?? LOCAL;
    } finally {
      select.disabled = false;
    }
  };
  // A new workstation: typed in (`user@host` or an ssh config alias), connected on Enter.
  const add = h("input", {
    type: "text", placeholder: "user@host", hidden: true, "data-testid": "machine-host", "aria-label": "Workstation to connect to with ssh",
    onkeydown: (e: KeyboardEvent) => {
      if (e.key === "Escape") { add.hidden = true; select.value = m.current ?? LOCAL; }
      if (e.key === "Enter" && add.value.trim()) connect(add.value.trim());
    },
  });
  select.addEventListener("change", () => {
    add.hidden = select.value !== OTHER;
    if (select.value === OTHER) add.focus();
    else connect(select.value === LOCAL ? null : select.value);
  });
  return h("span", { class: "machine" }, select, add, error);
}

/** A banner that says when a workstation's connection is lost and when it is retried; `reload` on return. */
export async function connectionBanner(backend: Backend, reload: () => void): Promise<HTMLElement> {
  const el = h("div", { class: "banner warn", role: "alert", "data-testid": "connection-lost", hidden: true });
  await backend.onConnection((ev: ConnectionEvent) => {
    if (ev.ok) return reload();
    el.textContent = `Lost the connection to ${ev.host}: ${ev.error ?? "no answer"}. Reconnecting in ${ev.retry_in_s ?? 1} s…`;
    el.hidden = false;
  });
  return el;
}
