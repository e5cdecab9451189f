import { describe, expect, it, vi } from "vitest";
vi.mock("./charts", () => ({ lineChart: () => ({ setData() {}, destroy() {} }) }));
import { entry, fakeBackend, gpu, gpuUser, sessionEntry, settle, validJob } from "./fake-backend";
import { attachCommand, endsIn, idleFor, sessionAsk, sessionLine, words } from "./sessions";
import { holderLine, holdersOf } from "./views/gpus";
import { queueView } from "./views/queue";
import { runView } from "./views/run";
import type { GpuStatus, JobDetail } from "./types";

describe("session words", () => {
  it("says durations as the CLI does", () => {
    const rows: [number, string][] = [[45_000, "45 s"], [60_000, "1 min"], [3_599_000, "59 min"], [3_600_000, "1 h"], [7_800_000, "2 h 10 min"], [86_400_000, "1 d"], [97_200_000, "1 d 3 h"], [-5, "0 s"]];
    for (const [ms, want] of rows) expect(words(ms), `${ms} ms`).toBe(want);
  });
  it("says when a session ends, how long a GPU has been idle, and how to attach", () => {
    const now = 1_000_000_000;
    expect(endsIn(now + 80 * 60_000 + 10_000, now)).toBe("ends in 1 h 20 min");
    expect(endsIn(now - 1, now)).toBe("ends now");
    expect(endsIn(null, now)).toBeNull();
    expect(idleFor(now - 7_800_000, now)).toBe("idle for 2 h 10 min");
    expect(idleFor(null, now)).toBeNull();
    expect(attachCommand(7, null)).toBe("gantry attach 7");
    expect(attachCommand(7, "alice@ws1")).toBe("gantry --host alice@ws1 attach 7");
    expect(sessionLine({ ends_at: now + 3_600_000, ports: [8888, 6006] }, now)).toBe("session · ends in 1 h · ports 8888, 6006");
    expect(sessionLine({ ends_at: null, ports: [] }, now)).toBe("session");
  });
  it("turns the form into what to ask the engine for, or says which field is wrong", () => {
    expect(sessionAsk({ kind: "shell", gpus: "2", length: " 2h ", image: "", port: "8888" })).toEqual(
      { notebook_port: null, gpus: 2, gpu_memory: null, gpu_type: null, image: null, length: "2h", cpus: null, memory: null, name: null });
    expect(sessionAsk({ kind: "notebook", gpus: "1", length: "", image: "jupyter:1", port: "8890" })).toMatchObject({ notebook_port: 8890, image: "jupyter:1", length: null });
    expect(sessionAsk({ kind: "shell", gpus: "1.5", length: "", image: "", port: "" })).toBe('GPUs must be a whole number (0 for none), not "1.5"');
    expect(sessionAsk({ kind: "notebook", gpus: "1", length: "", image: "", port: "70000" })).toBe('the port must be 1 to 65535, not "70000"');
  });
});

describe("sessions in the queue", () => {
  it("marks sessions, says when they end, and gives my running ones Open per port and the attach command", async () => {
    const q = [sessionEntry(5, { ports: [8888] }), sessionEntry(6, {}, { owner_uid: 1001, owner: "bob" }), entry(7, { state: "running" }, { gpus_assigned: [1], position: null, reason: null }),
               entry(8, { session: { ends_at: null, ports: [] } })];
    const { b, calls } = fakeBackend({ queue: () => Promise.resolve(q) });
    const v = queueView(b, 1000, () => {});
    await settle(10);
    expect(v.el.querySelector("[data-testid=session-5]")!.textContent).toBe("session · ends in 1 h 20 min · port 8888");
    expect(v.el.querySelector("[data-testid=session-6]")!.textContent).toBe("session · ends in 1 h 20 min");
    expect(v.el.querySelector("[data-testid=session-7]")).toBeNull();
    expect(v.el.querySelector("[data-testid=session-8]")!.textContent).toBe("session");
    // Only the owner's running session can be attached and opened.
    expect(v.el.querySelector("[data-testid=attach-5]")!.textContent).toContain("gantry attach 5");
    expect(v.el.querySelector("[data-testid=attach-6]")).toBeNull();
    expect(v.el.querySelector("[data-testid=attach-8]")).toBeNull();
    expect(v.el.querySelector("[data-testid=open-6-8888]")).toBeNull();
    (v.el.querySelector("[data-testid=open-5-8888]") as HTMLButtonElement).click();
    (v.el.querySelector("[data-testid=copy-attach-5]") as HTMLButtonElement).click();
    await settle();
    expect(calls.filter((c) => c.name === "openPort").map((c) => c.args)).toEqual([[5, 8888]]);
    expect(calls.filter((c) => c.name === "copyText").map((c) => c.args[0])).toEqual(["gantry attach 5"]);
    expect(v.el.querySelector("[data-testid=attach-5]")!.textContent).toContain("copied");
  });
  it("attaches through the workstation in use, and starts a session from the form", async () => {
    const { b, calls } = fakeBackend({ queue: () => Promise.resolve([sessionEntry(5)]), machines: () => Promise.resolve({ current: "alice@ws1", saved: [], ssh_config: [] }) });
    const v = queueView(b, 1000, () => {});
    await settle(10);
    expect(v.el.querySelector("[data-testid=attach-5] code")!.textContent).toBe("gantry --host alice@ws1 attach 5");
    const kind = v.el.querySelector("[data-testid=session-kind]") as HTMLSelectElement;
    kind.value = "notebook";
    kind.dispatchEvent(new Event("change"));
    expect((v.el.querySelector("[data-testid=session-port]") as HTMLInputElement).hidden).toBe(false);
    (v.el.querySelector("[data-testid=session-length]") as HTMLInputElement).value = "3h";
    (v.el.querySelector("[data-testid=session-form]") as HTMLFormElement).dispatchEvent(new Event("submit", { cancelable: true }));
    await settle();
    expect(calls.filter((c) => c.name === "startSession").map((c) => c.args[0])).toEqual([
      { notebook_port: 8888, gpus: 1, gpu_memory: null, gpu_type: null, image: null, length: "3h", cpus: null, memory: null, name: null }]);
    const out = v.el.querySelector("[data-testid=session-out]")!.textContent!;
    expect(out).toContain("Session 41 queued.");
    expect(out).toContain("gantry --host alice@ws1 attach 41");
  });
  it("shows the engine's refusal of a session (the lab's bounds) instead of a queued one", async () => {
    const { b } = fakeBackend({ startSession: () => Promise.reject("the session would last 3h; the lab allows sessions of at most 2h") });
    const v = queueView(b, 1000, () => {});
    await settle(10);
    (v.el.querySelector("[data-testid=session-form]") as HTMLFormElement).dispatchEvent(new Event("submit", { cancelable: true }));
    await settle();
    expect(v.el.querySelector("[data-testid=session-out] .error")!.textContent).toBe("the session would last 3h; the lab allows sessions of at most 2h");
  });
});

describe("a session's run page", () => {
  const detail = (spec: Partial<ReturnType<typeof validJob>["spec"]>, state = "running"): JobDetail => {
    const now = Date.now();
    return {
      job: { id: 9, name: "notebook", owner_uid: 1000, owner_gid: 1000, owner: "ada", image: "jupyter:1", gpus: 1, gpu_memory: null, priority: 0, retries: 0, timeout_ms: 7_200_000,
        job: validJob("notebook", spec), spec_hidden: false, state: state as any, source: "gantry run", submitted_at: now - 60_000, not_before: null, started_at: now - 40 * 60_000 - 10_000,
        finished_at: null, exit_code: null, attempts: 1, cancel_requested: false, message: null },
      attempts: [{ id: 1, job_id: 9, n: 1, container_id: "c", gpus: [0], gpu_uuids: [], started_at: now - 40 * 60_000 - 10_000, ended_at: state === "running" ? null : now, exit_code: null, reason: null, message: null }],
      events: [], reason: null,
    };
  };
  it("says its class and end, and offers attach and Open while it runs", async () => {
    const { b, calls } = fakeBackend({ job: () => Promise.resolve(detail({ interactive: true, ports: [8888] })) });
    const v = runView(b, 9, () => {});
    await settle(10);
    expect(v.el.querySelector("[data-testid=run-class]")!.textContent).toBe("interactive session · ends in 1 h 19 min");
    expect(v.el.querySelector("[data-testid=attach-9] code")!.textContent).toBe("gantry attach 9");
    (v.el.querySelector("[data-testid=open-9-8888]") as HTMLButtonElement).click();
    await settle();
    expect(calls.filter((c) => c.name === "openPort").map((c) => c.args)).toEqual([[9, 8888]]);
  });
  it("has nothing to attach or open once it ended; a batch job with ports says batch", async () => {
    const { b } = fakeBackend({ job: () => Promise.resolve(detail({ interactive: true, ports: [8888] }, "succeeded")) });
    const v = runView(b, 9, () => {});
    await settle(10);
    expect(v.el.querySelector("[data-testid=run-class]")!.textContent).toBe("interactive session");
    expect(v.el.querySelector("[data-testid=attach-9]")).toBeNull();
    expect(v.el.querySelector("[data-testid=open-9-8888]")).toBeNull();
    const batch = fakeBackend({ job: () => Promise.resolve(detail({ ports: [8080] })) });
    const w = runView(batch.b, 9, () => {});
    await settle(10);
    expect(w.el.querySelector("[data-testid=run-class]")!.textContent).toBe("batch");
    expect(w.el.querySelector("[data-testid=open-9-8080]")).not.toBeNull();
    expect(w.el.querySelector("[data-testid=attach-9]")).toBeNull();
  });
});

describe("idle processes outside Gantry", () => {
  it("are shown idle for how long their GPU has read 0 %; jobs and busy ones are not", () => {
    const now = Date.now();
    const idle = gpuUser(0, { job_id: null, job_name: null, user: "bob", pid: 4242, command: "python nb.py", used_memory: 3 * 2 ** 30, idle_since: now - 7_800_000 });
    expect(holderLine(idle, now)).toBe("outside Gantry: pid 4242 python nb.py (bob) · 3.0 GiB · idle for 2 h 10 min");
    expect(holderLine({ ...idle, idle_since: null }, now)).toBe("outside Gantry: pid 4242 python nb.py (bob) · 3.0 GiB");
    // A Gantry job's idleness is the idle watch's business ([sessions] idle_after), not this line's.
    expect(holderLine(gpuUser(1, { idle_since: now - 7_800_000 }), now)).toBe("job 12 train (ada)");
    const status: GpuStatus = { backend: "nvml", note: null, gpus: [gpu(0), gpu(1)], holders: [], reserved: [], users: [idle, gpuUser(1, { job_id: null, pid: 7, command: "train", user: "eve" })], library: null };
    const hs = holdersOf(status, "ada", now);
    expect(hs.get(0)![0]).toMatchObject({ kind: "outside", idle: true });
    expect(hs.get(1)![0].idle).toBeUndefined();
  });
});
