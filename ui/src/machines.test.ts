import { describe, expect, it } from "vitest";
import { fakeBackend, settle } from "./fake-backend";
import { connectionBanner, machineSwitcher } from "./machines";
import type { ConnectionEvent } from "./types";

describe("machine switcher", () => {
  it("offers this computer, saved workstations and ssh config hosts, and reloads on the chosen one", async () => {
    let reloads = 0;
    const { b, calls } = fakeBackend();
    const el = await machineSwitcher(b, () => reloads++);
    const select = el.querySelector("select")!;
    expect([...select.options].map((o) => o.textContent)).toEqual(["This computer", "alice@ws1", "lab", "Add a workstation…"]);
    select.value = "lab";
    select.dispatchEvent(new Event("change"));
    await settle();
    expect(calls.find((c) => c.name === "connectMachine")!.args).toEqual(["lab"]);
    expect(reloads).toBe(1);
  });

  it("says why a workstation cannot be reached and stays where it was", async () => {
    const { b } = fakeBackend({ connectMachine: () => Promise.reject("ssh: Permission denied (publickey)") });
    const el = await machineSwitcher(b, () => { throw new Error("no reload"); });
    const select = el.querySelector("select")!;
    select.value = "alice@ws1";
    select.dispatchEvent(new Event("change"));
    await settle();
    const err = el.querySelector<HTMLElement>("[data-testid=machine-error]")!;
    expect(err.hidden).toBe(false);
    expect(err.textContent).toContain("Permission denied");
    expect(select.value).toBe("");
  });

  it("shows a banner while the connection is lost and reloads when it is back", async () => {
    let emit: (ev: ConnectionEvent) => void = () => {};
    let reloads = 0;
    const { b } = fakeBackend({ onConnection: (cb) => { emit = cb; return Promise.resolve(() => {}); } });
    const el = await connectionBanner(b, () => reloads++);
    expect(el.hidden).toBe(true);
    emit({ host: "lab", ok: false, error: "ssh closed the connection", retry_in_s: 4 });
    expect(el.hidden).toBe(false);
    expect(el.textContent).toBe("Lost the connection to lab: ssh closed the connection. Reconnecting in 4 s…");
    emit({ host: "lab", ok: true });
    expect(reloads).toBe(1);
  });
});
