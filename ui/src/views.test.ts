import { describe, expect, it, vi } from "vitest";
vi.mock("./charts", () => ({ lineChart: () => ({ setData() {}, destroy() {} }) }));
import { entry, fakeBackend, gpu, settle } from "./fake-backend";
import { holdersOf } from "./views/gpus";
import { historyView, ROW_H } from "./views/history";
import { queueView, sortQueue } from "./views/queue";
import { errorText, submitView } from "./views/submit";
import { mount } from "./main";
import type { EngineInfo, Preview } from "./types";

describe("queue view", () => {
  it("shows why a job waits and offers cancel only on my jobs", async () => {
    const q = [entry(1, { state: "running", owner_uid: 1000 }, { gpus_assigned: [0], position: null, reason: null }),
               entry(2, { owner_uid: 1001, owner: "bob" }, { position: 1, reason: "needs 2 free GPUs, 1 available" })];
    const { b, calls } = fakeBackend({ queue: () => Promise.resolve(q) });
    const v = queueView(b, 1000, () => {});
    await settle();
    const rows = v.el.querySelectorAll("tbody tr");
    expect(rows.length).toBe(2);
    expect(rows[1].textContent).toContain("needs 2 free GPUs, 1 available");
    expect(rows[0].textContent).toContain("GPU 0");
    expect(v.el.querySelector("[data-testid=cancel-1]")).not.toBeNull();
    expect(v.el.querySelector("[data-testid=cancel-2]")).toBeNull();
    (v.el.querySelector("[data-testid=cancel-1]") as HTMLButtonElement).click();
    await settle();
    expect(calls.filter((c) => c.name === "cancel").map((c) => c.args[0])).toEqual([1]);
  });
  it("lists running jobs first, then queued by position", () => {
    const q = sortQueue([entry(3, {}, { position: 2 }), entry(4, {}, { position: 1 }), entry(5, { state: "running" }, { position: null })]);
    expect(q.map((e) => e.job.id)).toEqual([5, 4, 3]);
  });
});

describe("history view", () => {
  it("pages from the backend and renders only visible rows", async () => {
    const { b, calls } = fakeBackend();
    const v = historyView(b, () => {});
    document.body.append(v.el);
    await settle(10);
    expect(v.el.querySelector("[data-testid=history-count]")!.textContent).toBe("1,000 runs");
    const rendered = v.el.querySelectorAll(".vt-row").length;
    expect(rendered).toBeGreaterThan(0);
    expect(rendered).toBeLessThan(60);
    const first = calls.find((c) => c.name === "history")!.args[0] as any;
    expect(first.limit).toBe(200);
    const scroller = v.el.querySelector("[data-testid=history-scroll]") as HTMLElement;
    scroller.scrollTop = 700 * ROW_H;
    scroller.dispatchEvent(new Event("scroll"));
    await settle(10);
    const offsets = calls.filter((c) => c.name === "history").map((c) => (c.args[0] as any).offset);
    expect(offsets).toContain(600);
    expect(v.el.querySelector("[data-testid=history-row-300]")).not.toBeNull(); // row index 700 is id 300
    v.el.remove();
  });
  it("filters by status and sorts by a clicked column", async () => {
    const { b, calls } = fakeBackend();
    const v = historyView(b, () => {});
    await settle(10);
    const status = v.el.querySelector("select[aria-label=Status]") as HTMLSelectElement;
    status.value = "failed";
    status.dispatchEvent(new Event("change"));
    await settle(10);
    expect(v.el.querySelector("[data-testid=history-count]")!.textContent).toBe("334 runs");
    (Array.from(v.el.querySelectorAll(".vt-head .sortable")).find((e) => e.textContent!.startsWith("Duration")) as HTMLElement).click();
    await settle(10);
    const last = calls.filter((c) => c.name === "history").pop()!.args[0] as any;
    expect(last).toMatchObject({ status: "failed", sort: "duration", asc: false });
  });
});

describe("submit view", () => {
  const previews: Preview[] = [
    { path: "/a/ok.yaml", file_name: "ok.yaml", job: { name: "ok", spec: { image: "img", gpus: 1, priority: 0, retries: 0, command: ["python", "train.py"] }, gpus: 1, gpu_memory: null, retries: 0 }, error: null, spec_error: null },
    { path: "/a/bad.yaml", file_name: "bad.yaml", job: null, error: "line 2", spec_error: { message: "unknown field `gpu`", line: 2, column: 1, hint: "remove it" } },
  ];
  it("previews each file with errors and line numbers, then submits only valid ones", async () => {
    const { b, calls } = fakeBackend({ previewPaths: () => Promise.resolve(previews), submitPaths: (p) => { calls.push({ name: "submitPaths", args: [p] }); return Promise.resolve([{ Ok: [7] }]); } });
    const go = vi.fn();
    const v = submitView(b, go);
    await v.handleFiles(["/a/ok.yaml", "/a/bad.yaml"]);
    expect(v.el.querySelectorAll("[data-testid=preview-ok]").length).toBe(1);
    expect(v.el.querySelector("[data-testid=preview-error]")!.textContent).toContain("line 2, column 1: unknown field `gpu`");
    const btn = v.el.querySelector("[data-testid=submit-confirm]") as HTMLButtonElement;
    expect(btn.disabled).toBe(false);
    expect(btn.textContent).toBe("Submit 1 job");
    btn.click();
    await settle();
    expect(calls.find((c) => c.name === "submitPaths")!.args[0]).toEqual(["/a/ok.yaml"]);
    expect(go).toHaveBeenCalledWith("#/run/7");
  });
  it("formats spec errors with position and fix", () => {
    expect(errorText(previews[1])).toBe("line 2, column 1: unknown field `gpu`\nfix: remove it");
  });
});

describe("GPU holders and the app shell", () => {
  it("names who holds each GPU, including processes outside Gantry", () => {
    const status = { backend: "nvml" as const, note: null, gpus: [gpu(0), gpu(1, { processes: [{ pid: 5, used_memory: 1, container_id: null }] })], holders: [[0, [1]]] as [number, number[]][] };
    const h = holdersOf(status, [entry(1, { owner: "ada", name: "resnet", owner_uid: 1000 })], 1000);
    expect(h.get(0)).toEqual([{ label: "ada · resnet (#1)", mine: true }]);
    expect(h.get(1)![0].label).toBe("1 process(es) outside Gantry");
  });
  it("says clearly when GPUs are simulated, and routes a drop to the submit preview", async () => {
    let dropped: ((p: string[]) => void) | null = null;
    const { b, calls } = fakeBackend({ onFileDrop: (cb) => { dropped = cb; return Promise.resolve(() => {}); } });
    const root = document.createElement("div");
    await mount(root, b);
    expect(root.querySelector("[data-testid=sim-banner]")!.textContent).toContain("Simulated GPUs");
    dropped!(["/x/job.yaml"]);
    await settle();
    expect(location.hash).toBe("#/submit");
    expect(calls.some((c) => c.name === "previewPaths")).toBe(true);
  });
  it("says in the header which engine it talks to", async () => {
    const engine: EngineInfo = { kind: "system", label: "System engine (/run/gantry/gantry.sock)", socket: "/run/gantry/gantry.sock", problem: null };
    const { b } = fakeBackend({ engine: () => Promise.resolve(engine) });
    const root = document.createElement("div");
    await mount(root, b);
    const el = root.querySelector("header [data-testid=engine]")!;
    expect(el.textContent).toBe("System engine (/run/gantry/gantry.sock)");
    expect(el.getAttribute("title")).toBe("/run/gantry/gantry.sock");
    expect(root.querySelector("header [data-testid=me]")!.textContent).toBe("ada");
  });
  it("names whose engine holds the machine, and asks nothing of an engine it cannot reach", async () => {
    const problem = "the Gantry engine of bob (pid 77, socket /home/bob/.local/state/gantry/gantry.sock) already manages this machine's GPUs: use it, or ask an admin to install the Gantry service";
    const { b, calls } = fakeBackend({ engine: () => Promise.resolve({ kind: "blocked", label: "Engine of bob (cannot connect)", socket: null, problem }) });
    const root = document.createElement("div");
    await mount(root, b);
    expect(root.querySelector("header [data-testid=engine]")!.textContent).toBe("Engine of bob (cannot connect)");
    expect(root.querySelector("[data-testid=engine-problem]")!.textContent).toBe(problem);
    expect(root.querySelector("nav")).toBeNull();
    expect(calls).toEqual([]); // only engine() (overridden above, so not recorded) was called
  });
});
